"""The culler benchmark's tables in docs/benchmarks.md, rendered from `results/culler.json`.

`python -m benchmarks.culler_docs` prints them; `--write docs/benchmarks.md` replaces each
block between its `% BEGIN culler_docs <name>` and `% END culler_docs <name>` lines (MyST
comments), so the docs follow a new whole run without copying figures by hand. The prose
around the tables (what the figures say, goals met or missed) is still written by a person.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
FAMILY_NAMES = {"reserving": "reserving", "time_sliced": "time-sliced"}
# the per-mix table's rows, in the docs' order: the row's key in culler.json and its label
RUN_ROWS = [
    ("jupyterhub_idle_culler_z2jh", "jupyterhub-idle-culler (baseline)"),
    ("fracspawner_reserving", "fracspawner defaults, reserving (HAMi: `kernel_gpu_idle` off)"),
    ("fracspawner_time_sliced", "fracspawner defaults, time-sliced"),
    ("fracspawner_reserving_overcommit", "**reserving, `overcommit: 2`**"),
    ("fracspawner_time_sliced_overcommit", "**time-sliced, `overcommit: 2`**"),
    (
        "fracspawner_reserving_kernel_30m",
        "reserving, `kernel_gpu_idle: 30m` set in the catalog (the default before)",
    ),
    ("fracspawner_hibernate", "time-sliced, hibernate 5m / kernel off / GPU server 2h"),
    ("fracspawner_reserving_half_gpus", "**reserving, `overcommit: 2`, half the GPUs**"),
    ("fracspawner_time_sliced_half_gpus", "**time-sliced, `overcommit: 2`, half the GPUs**"),
]


def n(value: float | None) -> str:
    """A figure as the docs write it: thousands separated, a whole float without its .0."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return "n/a" if value is None else f"{value:,}"


def pct(value: float | None) -> str:
    return "n/a (baseline 0)" if value is None else f"{value} %"


def missed(goals: dict[str, bool]) -> str:
    return ", ".join(k for k, ok in goals.items() if not ok) or "none"


# the person-minutes waited beside the floor (benchmarks/culler_floor.py): a run from before
# the floor has none of these keys, and its column says "n/a"
WAITS_HEAD = "wait person-min: floor (all runs given up) / ours / baseline"
# people with a server who cannot use a notebook: a cell of theirs queued behind its kernel's
# resume, waiting for room ("n/a" for a run before the replay counted it); the baseline's is 0
KERNEL_WAITS_HEAD = "person-min at the keyboard, kernel waiting for room"


def waits(c: dict) -> str:
    """`floor.forced_wait_person_minutes` (`..._without_runs`) / `wait_minutes` /
    `baseline_wait_minutes` of one row; "n/a" for each the row lacks."""
    fl = c.get("floor")
    low = "n/a" if fl is None else (
        f"{n(fl['forced_wait_person_minutes'])} "
        f"({n(fl['forced_wait_person_minutes_without_runs'])})"
    )  # fmt: skip
    return f"{low} / {n(c.get('wait_minutes'))} / {n(c.get('baseline_wait_minutes'))}"


def oom(total: int, row: dict) -> str:
    """CUDA OOM in cells, and how many of them met no room beside co-tenants (the rest met
    their own slice's limit); runs before the split show the total alone."""
    co = row.get("cuda_oom_co_tenants")
    return n(total) if co is None else f"{n(total)} ({n(co)})"


def lost(row: dict) -> str:
    """Runs lost to CUDA out of memory (`runs_lost_to_cuda_oom`), and how many of them met no
    room beside co-tenants; "n/a" for a run before the replay ended runs at their error."""
    total = row.get("runs_lost_to_cuda_oom")
    return "n/a" if total is None else f"{n(total)} ({n(row['runs_lost_to_cuda_oom_co_tenants'])})"


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def headline(result: dict) -> list[str]:
    """`capacity.<mix>.<family>.half_gpus` against jupyterhub-idle-culler on all the GPUs."""
    head = ["mix", "family", "GPUs (baseline's)", "users waiting, % of the baseline on all GPUs",
            "waits (baseline)", "turned away (baseline)", "wait p95 (baseline)",
            "disruptions (baseline)", "present / false culls", "GPU state lost",
            "host memory peak per node (budget)", "waits for memory at admission",
            "CUDA OOM in cells (co-tenants)", "runs lost to CUDA OOM (co-tenants)",
            "cell-minutes waiting for room", KERNEL_WAITS_HEAD, "swap orders / grants",
            WAITS_HEAD, "goals missed"]  # fmt: skip
    rows = []
    for mix, families in result["capacity"].items():
        for family, cap in families.items():
            h = cap["half_gpus"]
            rows.append([
                mix, FAMILY_NAMES[family], f"{h['gpus']} ({h['baseline_gpus']})",
                pct(h["users_waiting_pct_of_full_baseline"]),
                f"{h['wait_episodes']} ({h['baseline_wait_episodes']})",
                f"{h['turned_away']} ({h['baseline_turned_away']})",
                f"{n(h['wait_p95_min'])} min ({n(h['baseline_wait_p95_min'])})",
                f"{h['disruptions']} ({h['baseline_disruptions']})",
                f"{h['present_culls']} / {h['false_culls']}", n(h["gpu_state_lost"]),
                f"{n(h['host_memory_peak_per_node_gib'])} GiB "
                f"({n(h['host_memory_budget_gib'])} GiB)",
                n(h["admission_waits"]), oom(h["cuda_oom_in_cells"], h), lost(h),
                n(h["memory_waits"]), n(h.get("kernel_wait_minutes")),
                f"{n(h['swap_orders'])} / {n(h['grants'])}", waits(h), missed(h["goals"]),
            ])  # fmt: skip
    return table(head, rows)


def full_cluster(capacity: dict) -> list[str]:
    """`capacity` (over-committed) or `capacity_without_overcommit`, on the full cluster."""
    head = ["mix", "family", "users waiting", "wait p95", "disruptions (baseline)",
            "present / false culls", "idle reserved slice-h", "CUDA OOM in cells (co-tenants)",
            "runs lost to CUDA OOM (co-tenants)", "stalled runs", "host memory peak per node",
            WAITS_HEAD,
            "goals missed"]  # fmt: skip
    rows = []
    for mix, families in capacity.items():
        for family, c in families.items():
            rows.append([
                mix, FAMILY_NAMES[family], pct(c["users_waiting_pct"]),
                f"{n(c['wait_p95_min'])} min", f"{c['disruptions']} ({c['baseline_disruptions']})",
                f"{c['present_culls']} / {c['false_culls']}",
                pct(c["idle_reserved_slice_hours_pct"]), oom(c["resume_failures"], c),
                lost(c), n(c["stalled_runs"]), f"{n(c['host_memory_peak_per_node_gib'])} GiB",
                waits(c), missed(c["goals"]),
            ])  # fmt: skip
    return table(head, rows)


def runs(result: dict) -> list[str]:
    """Every replay, per mix (`runs.<mix>.<row>`)."""
    head = ["mix", "culler", "waited or turned away", "of them turned away", "wait p95",
            "idle reserved slice-h", "idle GPU memory GiB·h", "disruptions",
            "present / false culls", "stalled runs", "CUDA OOM in cells (co-tenants)",
            "runs lost to CUDA OOM (co-tenants)", "cell-minutes waiting for room",
            "waits for memory at admission",
            "swap orders / grants / restores", "host budget shut-downs", "GPU state lost",
            "host memory peak per node"]  # fmt: skip
    rows = []
    for mix, data in result["runs"].items():
        for i, (key, label) in enumerate(RUN_ROWS):
            r = data[key]
            first = f"{mix} ({data['users']} users, {data['slots']} slots)" if i == 0 else ""
            rows.append([
                first, label, n(r["wait_episodes"]), n(r["turned_away"]),
                f"{n(r['wait_p95_min'])} min", n(r["idle_reserved_slice_hours"]),
                n(r["idle_gpu_memory_gib_hours"]), n(r["culls_returned_to_within_30_min"]),
                f"{r['culls_while_present']} / {r['false_culls']}",
                f"{r['stalled_runs']} of {r['runs']}",
                oom(r["resume_failures"], r), lost(r), n(r["memory_waits"]),
                n(r["admission_waits"]),
                f"{n(r['swap_orders'])} / {n(r['grants'])} / {n(r['resumes'])}",
                n(r["host_budget_orders"]), n(r["gpu_state_lost"]),
                f"{n(r['host_memory_peak_per_node_gib'])} GiB",
            ])  # fmt: skip
    return table(head, rows)


def blocks(result: dict) -> dict[str, list[str]]:
    return {
        "headline": headline(result),
        "overcommit": full_cluster(result["capacity"]),
        "without_overcommit": full_cluster(result["capacity_without_overcommit"]),
        "runs": runs(result),
    }


def replace_blocks(text: str, rendered: dict[str, list[str]]) -> str:
    """text with each named block's lines replaced; a block the text lacks is an error."""
    for name, lines in rendered.items():
        pattern = re.compile(
            rf"^(% BEGIN culler_docs {name}\b[^\n]*\n).*?^(% END culler_docs {name}\b)",
            re.S | re.M,
        )
        if not pattern.search(text):
            raise ValueError(f"no '% BEGIN culler_docs {name}' ... '% END' block in the text")
        body = "\n".join(lines)
        text = pattern.sub(lambda m, body=body: f"{m[1]}\n{body}\n\n{m[2]}", text, count=1)
    return text


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=HERE / "results" / "culler.json")
    parser.add_argument("--write", type=Path, help="the Markdown file whose blocks to replace")
    args = parser.parse_args(argv)
    rendered = blocks(json.loads(args.json.read_text()))
    if args.write:
        args.write.write_text(replace_blocks(args.write.read_text(), rendered))
    else:
        for name, lines in rendered.items():
            print(f"% {name}\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
