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
