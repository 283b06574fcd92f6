"""docs/benchmarks.md's culler tables are those benchmarks/culler_docs.py renders from the
committed benchmarks/results/culler.json (a new whole run: `python -m benchmarks.culler_docs
--write docs/benchmarks.md`)."""

import json
from pathlib import Path

import pytest

from benchmarks import culler_docs

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "benchmarks.md"
RESULT = REPO / "benchmarks" / "results" / "culler.json"


def test_the_docs_tables_are_the_committed_run():
    text = DOCS.read_text()
    rendered = culler_docs.replace_blocks(text, culler_docs.blocks(json.loads(RESULT.read_text())))
    assert rendered == text, "run: python -m benchmarks.culler_docs --write docs/benchmarks.md"


def test_a_missing_block_is_named():
    with pytest.raises(ValueError, match="culler_docs headline"):
        culler_docs.replace_blocks("no blocks here\n", {"headline": ["| a |"]})


def test_a_block_is_replaced_and_the_text_around_it_kept():
    text = "before\n% BEGIN culler_docs x (note)\n\n| old |\n\n% END culler_docs x\nafter\n"
    out = culler_docs.replace_blocks(text, {"x": ["| new |", "|---|"]})
    block = "% BEGIN culler_docs x (note)\n\n| new |\n|---|\n\n% END culler_docs x\n"
    assert out == "before\n" + block + "after\n"


def _one_row(result: dict, **extra) -> dict:
    """The committed run's classroom reserving row, alone, with `extra` keys in each level."""
    new = ("wait_minutes", "baseline_wait_minutes", "floor")
    cap = {k: v for k, v in result["capacity"]["classroom"]["reserving"].items() if k not in new}
    cap |= extra.get("full", {})
    half = {k: v for k, v in cap["half_gpus"].items() if k not in new}
    cap["half_gpus"] = half | extra.get("half", {})
    return {"capacity": {"classroom": {"reserving": cap}}}


def test_the_floor_column_says_n_a_for_a_run_without_it():
    # culler.json from before the floor (benchmarks/culler_floor.py) renders, the column "n/a"
    result = _one_row(json.loads(RESULT.read_text()))
    head, _, row = culler_docs.headline(result)
    assert "wait person-min: floor (all runs given up) / ours / baseline" in head
    assert "| n/a / n/a / n/a |" in row
    assert "| n/a / n/a / n/a |" in culler_docs.full_cluster(result["capacity"])[2]


def test_the_floor_column_shows_the_floor_beside_the_waiting():
    floor = {"forced_wait_person_minutes": 4043, "forced_wait_person_minutes_without_runs": 1925}
    waits = {"wait_minutes": 3776, "baseline_wait_minutes": 2364}
    result = _one_row(
        json.loads(RESULT.read_text()),
        half={"floor": floor} | waits,
        full={"floor": floor | {"forced_wait_person_minutes": 2987}} | waits,
    )
    assert "| 4,043 (1,925) / 3,776 / 2,364 |" in culler_docs.headline(result)[2]
    assert "| 2,987 (1,925) / 3,776 / 2,364 |" in culler_docs.full_cluster(result["capacity"])[2]
