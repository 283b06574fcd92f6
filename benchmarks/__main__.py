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
import traceback
from pathlib import Path

HERE = Path(__file__).parent
RESULTS = HERE / "results"


def discover() -> list[str]:
    return sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))


def _sections(text: str) -> dict[str, list[str]]:
    """The `## name` sections of an earlier summary.md."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = sections[line[3:].strip()] = []
        elif current is not None:
            current.append(line)
    return sections


def main(argv: list[str]) -> int:
    names = argv or discover()
    RESULTS.mkdir(exist_ok=True)
    sections: dict[str, list[str]] = {}
    failed = 0
    for name in names:
        module = importlib.import_module(f"benchmarks.bench_{name}")
        print(f"== {name}", flush=True)
        started = time.perf_counter()
        try:
            result = module.run(RESULTS)
        except Exception as exc:  # report and go on: one broken benchmark must not hide the others
            failed += 1
            traceback.print_exc()  # where it failed: a bare repr lost an hour's run once
            print(f"   FAILED: {exc!r}", flush=True)
            sections[name] = ["", f"FAILED: `{exc!r}`"]
            continue
        wall = round(time.perf_counter() - started, 2)
        if not getattr(module, "EXACT_KEYS", False):  # outside checks read some files' keys
            result.setdefault("wall_seconds", wall)
        (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        text = json.dumps(result, indent=2, default=str)
        sections[name] = ["", f"{wall} s", "", "```json", *text.splitlines(), "```"]
        print(text, flush=True)
    _write_summary(sections, keep_others=bool(argv))
    return 1 if failed else 0


def _write_summary(sections: dict[str, list[str]], *, keep_others: bool) -> None:
    """summary.md with these sections; a partial run keeps the other benchmarks' sections as
    the file has them now (read at the end: another run may have rewritten it meanwhile)."""
    path = RESULTS / "summary.md"
    kept = _sections(path.read_text()) if keep_others and path.exists() else {}
    lines = [f"# Benchmark results ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", ""]
    lines.append(f"Machine: {platform.machine()}, Python {platform.python_version()}")
    for name, body in {**kept, **sections}.items():
        while body and not body[-1].strip():
            body.pop()
        lines += ["", f"## {name}", *body]
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
