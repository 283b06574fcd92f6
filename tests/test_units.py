"""Amounts as people read them (issue 13 item 4): the quota line, reasons and refusals."""

from __future__ import annotations

import pytest

from fracspawner.choice.offers import build_offer_model
from fracspawner.model.catalog import AccessRule
from fracspawner.model.units import gib, gpu_amount, gpu_share
from tests.conftest import DEMO_CATALOG


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (0.0, "0 GPU"),
        (0.125, "1/8 GPU"),
        (1 / 7, "1/7 GPU"),
        (0.142857, "1/7 GPU"),  # the API's 6-decimal rounding reads as the fraction it is
        (1.85714, "1 6/7 GPUs"),  # the "1.85714 left"
        (2.0, "2 GPUs"),
        (1.875, "1 7/8 GPUs"),
        (1 / 7 + 1 / 8, "0.27 GPU"),  # 15/56 reads worse than a rounded decimal
    ],
)
def test_gpu_amounts_read_as_fractions(value, words):
    assert gpu_amount(value) == words


def test_share_and_memory():
    assert gpu_share(0.25) == "1/4"
    assert gib(10240) == "10 GiB" and gib(20378) == "19.9 GiB"


def test_the_form_model_says_the_same_numbers_as_the_api_fields():
    from fracspawner.backends import load_catalog

    catalog = load_catalog(DEMO_CATALOG)
    model = build_offer_model(catalog, rule=AccessRule(pools=("h100",), max_gpu=2), used_gpu=1 / 7)
    quota = model["quota"]
    assert (quota["used_text"], quota["max_text"], quota["remaining_text"]) == (
        "1/7",
        "2 GPUs",
        "1 6/7 GPUs",
    )
    assert gpu_amount(quota["remaining_gpu"]) == quota["remaining_text"]
