"""`make bench`: run every `benchmarks/bench_*.py` module and collect its results.

Each module exposes `run(results_dir: Path) -> dict`; its dict is written to
`benchmarks/results/<name>.json` and summarised in `benchmarks/results/summary.md`.
`python -m benchmarks form culler` runs only the named ones.
"""

from __future__ import annotations

import importlib
import json
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
RESULTS = HERE / "results"


def discover() -> list[str]:
    return sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))


def main(argv: list[str]) -> int:
    names = argv or discover()
    RESULTS.mkdir(exist_ok=True)
    summary = [f"# Benchmark results ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", ""]
    summary.append(f"Machine: {platform.machine()}, Python {platform.python_version()}")
    failed = 0
    for name in names:
        module = importlib.import_module(f"benchmarks.bench_{name}")
        print(f"== {name}", flush=True)
        started = time.perf_counter()
        try:
            result = module.run(RESULTS)
        except Exception as exc:  # report and go on: one broken benchmark must not hide the others
            failed += 1
            print(f"   FAILED: {exc!r}", flush=True)
            summary += ["", f"## {name}", "", f"FAILED: `{exc!r}`"]
            continue
        result.setdefault("wall_seconds", round(time.perf_counter() - started, 2))
        (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        summary += [
            "",
            f"## {name}",
            "",
            "```json",
            json.dumps(result, indent=2, default=str),
            "```",
        ]
        print(json.dumps(result, indent=2, default=str), flush=True)
    (RESULTS / "summary.md").write_text("\n".join(summary) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
