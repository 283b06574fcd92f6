"""Refusals whose advice can be followed (issue 21 items 4 and 9): the servers holding the quota
by name, a smaller size only when one fits, and lists of only what this user could take."""

from __future__ import annotations

import pytest

from fracspawner.choice.options import OptionsError, free_elsewhere, resolve_choice
from fracspawner.model.catalog import AccessRule
from tests.test_options import CATALOG, EVERYONE, RESEARCH, FakeCapacity


def _refusal(options, **kwargs) -> str:
    with pytest.raises(OptionsError) as info:
        resolve_choice(CATALOG, options, **kwargs)
    return str(info.value)


def test_quota_refusal_names_the_servers_holding_it():
    # the demo's default rule: H100 only, 1/4 GPU; the default server holds 1/8
    text = _refusal({"gpu": "1/4"}, rule=EVERYONE, used_gpu=0.125, holders={"": 0.125})
    assert "(your default server holds 1/8 GPU). Stop it on your Home page" in text
    assert "or choose a size that fits: 1/8 GPU, 10 GiB." in text
    text = _refusal({"gpu": "1/8"}, rule=EVERYONE, used_gpu=0.25, holders={"a": 0.125, "b": 0.125})
    assert "(your server 'a' (1/8 GPU) and your server 'b' (1/8 GPU) hold 1/4 GPU)" in text
    assert "Stop one of them on your Home page." in text
    # nothing left: no "smaller size" that would be refused too
    assert "smaller" not in text and "fits" not in text


def test_no_smaller_size_is_suggested_when_none_exists():
    # a 1/8 quota and a pool whose smallest size is 1/4 (the T4): nothing fits it
    rule = AccessRule(pools=("t4",), max_gpu=0.125)
    text = _refusal({"gpu": "1/4"}, rule=rule)
    assert "Choose a smaller size" not in text
    assert text.endswith("No size you may use fits it; ask an admin for a larger quota.")


def test_unknown_pool_lists_only_the_pools_this_user_may_use():
    text = _refusal({"gpu": "1/4", "pool": "h200"}, rule=EVERYONE)
    assert text == "pool: unknown pool 'h200'. Available: h100."


def test_you_may_choose_lists_only_sizes_within_the_quota():
    text = _refusal({"gpu": "mig-1g.10gb"}, rule=EVERYONE)
    assert "You may choose: 1/4, 1/8, 10GiB, 20GiB." in text  # not 1/2 or 1 (over 1/4 GPU)


def test_free_instead_says_more_what():
    counts = {(p.name, str(o)): (4, 8) for p in CATALOG.pools.values() for o in p.offers}
    pools = list(CATALOG.pools.values())
    text = free_elsewhere(CATALOG, pools, FakeCapacity(counts))
    assert text.endswith(" more choices on the form."), text
    assert " free and " not in text
    assert RESEARCH.pools is None  # every pool: the list above is long enough to be cut
