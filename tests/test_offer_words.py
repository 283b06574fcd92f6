"""What an offer says (issue 13, item 8): the summary in plain words, the technical facts
(sharing technology, SMs, the GPU) under Details, in the API's model and the plain form."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fracspawner.backends import load_catalog
from fracspawner.choice.offers import BACKEND_NAMES, build_offer_model
from fracspawner.hub.form import render_form
from fracspawner.model.catalog import AccessRule

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples" / "catalogs").glob("*.yaml"))
DEMO = load_catalog(EXAMPLES[0].with_name("demo.yaml"))
TECHNOLOGIES = {name for name in BACKEND_NAMES.values() if name != "a whole GPU"}


def offers(catalog) -> dict[tuple[str, str], dict]:
    model = build_offer_model(catalog, rule=AccessRule(), used_gpu=0)
    return {(p["name"], o["spec"]): o for p in model["pools"] for o in p["offers"]}


def test_a_fraction_reads_in_plain_words_with_the_technology_and_sms_on_demand():
    quarter = offers(DEMO)[("h100", "1/4")]
    assert (
        quarter["summary"] == "1/4 of an H100-80GB: 19.9 GiB of GPU memory, memory limit enforced"
    )
    assert quarter["details"] == [
        "Sharing technology: HAMi (a memory limit per container)",
        "Compute: ~33 of 132 SMs (streaming multiprocessors, the GPU's compute units)",
        "GPU: H100-80GB with 79.6 GiB of memory",
    ]


@pytest.mark.parametrize(
    ("pool", "spec", "isolation", "technology"),
    [
        ("t4", "1/4", "memory shared with others, not isolated", "time-slicing (no memory limit"),
        ("a100-mig", "mig-1g.10gb", "isolated in hardware", "MIG (the GPU split in hardware)"),
        (
            "h100",
            "1",
            "the GPU to yourself",
            "none, whole GPUs are not shared (the pool uses HAMi)",
        ),
    ],
)
def test_isolation_in_words_technology_in_details(pool, spec, isolation, technology):
    offer = offers(DEMO)[(pool, spec)]
    assert offer["summary"].endswith(f"GiB of GPU memory, {isolation}")
    assert offer["details"][0].startswith(f"Sharing technology: {technology}")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_no_summary_names_a_technology_or_sms(path):
    for (pool, spec), offer in offers(load_catalog(path)).items():
        # what comes after the size: a MIG size is called "MIG 1g.10gb", its own name
        words = offer["summary"].split(": ", 1)[1]
        assert "SM" not in words and not any(t in words for t in TECHNOLOGIES), (pool, spec)
        assert re.search(r"\d GiB of GPU memory", words), words  # "10 GiB", one unit style
        assert offer["details"][0].startswith("Sharing technology: "), (pool, spec)
        assert offer["details"][-1].startswith("GPU: ") and offer["details"][-1].endswith(
            ("GiB of memory", "GiB of memory each")
        )


def test_the_plain_form_puts_details_in_a_closed_disclosure_after_the_summary():
    html = render_form(build_offer_model(DEMO, rule=AccessRule(), used_gpu=0))
    item = html.split('data-pool="h100" data-spec="1/4">', 1)[1].split("</details>", 1)[0]
    summary = item.split('class="fs-summary">', 1)[1].split("</span>", 1)[0]
    assert summary == "1/4 of an H100-80GB: 19.9 GiB of GPU memory, memory limit enforced"
    details = item.split('<details class="fs-details">', 1)[1]
    assert "<li>Compute: ~33 of 132 SMs (streaming multiprocessors" in details
    assert "<li>Sharing technology: HAMi (a memory limit per container)</li>" in details
    assert '<details class="fs-details" open' not in html  # closed until asked for


class _FullT4:
    """Capacity with every T4 slot taken and the rest free (the shape the picker reads)."""

    stale = False

    def get(self, pool: str, spec: str):
        from types import SimpleNamespace

        free = 0 if pool == "t4" else 3
        return SimpleNamespace(free=free, total=4, note="")


@pytest.mark.parametrize("admission", ["refuse", "wait"])
def test_a_full_size_is_refused_or_queued_as_the_hub_admits(admission):
    """`admission = "wait"` queues a full size instead of refusing it: the picker must let the
    user take it (saying it will wait), where "refuse" marks it unavailable."""
    model = build_offer_model(
        DEMO, rule=AccessRule(), used_gpu=0, capacity=_FullT4(), full_waits=admission == "wait"
    )
    assert model["admission"] == admission
    t4 = next(o for p in model["pools"] if p["name"] == "t4" for o in p["offers"])
    h100 = next(o for p in model["pools"] if p["name"] == "h100" for o in p["offers"])
    assert t4["free"] == 0 and not h100["waits"] and h100["allowed"]
    if admission == "wait":
        assert t4["allowed"] and t4["waits"] and t4["reason"] is None
        html = " ".join(render_form(model).split())
        assert "(none free now: your server would wait for one)" in html
    else:
        assert not t4["allowed"] and not t4["waits"] and t4["reason"] == "None free right now."
