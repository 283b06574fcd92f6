"""The one validation path for form and REST user_options (pure: no hub, no cluster)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fracspawner.backends import load_catalog
from fracspawner.choice.options import OptionsError, resolve_choice
from fracspawner.model.catalog import AccessRule
from fracspawner.model.slices import parse_slice
from tests.conftest import DEMO_CATALOG

CATALOG = load_catalog(DEMO_CATALOG)
EVERYONE = CATALOG.rule_for("alice", [])
RESEARCH = CATALOG.rule_for("mira", ["ml-research"])


@dataclass(frozen=True)
class Counts:
    free: int | None
    total: int | None
    note: str = ""


class FakeCapacity:
    """A capacity snapshot with chosen counts (the real one is tested in test_capacity*)."""

    def __init__(self, counts: dict[tuple[str, str], tuple[int, int]]):
        self.counts = counts

    def get(self, pool: str, spec: str) -> Counts:
        return Counts(*self.counts.get((pool, spec), (None, None)))


def test_defaults_pick_pool_image_and_plan():
    choice = resolve_choice(CATALOG, {"gpu": "1/4"}, rule=EVERYONE)
    assert choice.pool.name == "h100"
    assert choice.image.name == "pytorch"
    assert choice.plan.labels["fracspawner.io/gpu"] == "0.25"


@pytest.mark.parametrize(
    "options, words",
    [
        # only form data comes as lists, and the spawner's options_from_form unwraps those;
        # the REST API's CONTRACT is one value per key
        ({"gpu": ["1/8"], "pool": "h100"}, 'gpu: expected one value like "1/4", got a list'),
        ({"gpu": "1/8", "pool": ["h100"]}, "pool: expected a name (a string), got list"),
        ({"gpu": "none", "image": ["pytorch"]}, "image: expected a name (a string), got list"),
        ({"gpu": {"spec": "1/8"}}, "got a dict"),
    ],
)
def test_rest_values_given_as_lists_are_refused(options, words):
    with pytest.raises(OptionsError) as info:
        resolve_choice(CATALOG, options, rule=EVERYONE)
    assert words in str(info.value)


@pytest.mark.parametrize(
    "options",
    [
        {"pool": "p" * 100_000, "gpu": "1/4"},
        {"image": "i" * 100_000},
        {"k" * 100_000: 1},
        {f"key-{i}-" + "x" * 1000: 1 for i in range(100)},
        {"gpu": "1" * 100_000},
        {"gpu": 10**4000},
    ],
)
def test_huge_values_are_not_echoed_whole(options):
    with pytest.raises(OptionsError) as info:
        resolve_choice(CATALOG, options, rule=EVERYONE)
    message = str(info.value)
    # at most 40 characters of a value, cut with an ellipsis; a handful of unknown keys
    assert len(message) < 600, message
    assert "xxxxxxxxxx" * 5 not in message and "p" * 41 not in message


def test_no_gpu_carries_no_gpu_plan():
    choice = resolve_choice(CATALOG, {}, rule=EVERYONE)
    assert choice.slice.kind == "none" and choice.pool is None
    assert not choice.plan.limits and not choice.plan.labels and not choice.plan.env


@pytest.mark.parametrize(
    "options, words",
    [
        ({"gpu": "1/4", "cpu_limit": 64}, "Unknown option(s): 'cpu_limit'"),
        ({"gpu": "1/4", "environment": {"CUDA_DISABLE_CONTROL": "1"}}, "Unknown option"),
        ({"gpu": "0.3"}, "multiple of 1/8"),
        ({"gpu": "lots"}, "gpu:"),
        ({"gpu": "1/4", "pool": "nope"}, "unknown pool 'nope'. Available: h100."),
        ({"gpu": "1/4", "pool": "a100-mig"}, "you may not use pool 'a100-mig'"),
        ({"gpu": "mig-1g.10gb"}, "no pool you may use offers mig-1g.10gb"),
        ({"gpu": "1/4", "image": "docker.io/evil:latest"}, "unknown image"),
        ({"gpu": "1/4", "pool": 3}, "pool: expected a name"),
        ({"gpu": "none", "pool": "h100"}, "is a GPU pool"),
        ({"gpu": "1/2"}, "Quota"),
    ],
)
def test_bad_options_are_refused_with_the_reason(options, words):
    with pytest.raises(OptionsError) as info:
        resolve_choice(CATALOG, options, rule=EVERYONE)
    assert words in str(info.value)


def test_quota_counts_other_servers():
    resolve_choice(CATALOG, {"gpu": "1/8"}, rule=EVERYONE, used_gpu=0.125)
    with pytest.raises(OptionsError, match=r"more than the 0 GPU left of your 1/4 GPU"):
        resolve_choice(CATALOG, {"gpu": "1/8"}, rule=EVERYONE, used_gpu=0.25)


def test_admin_override_skips_access_and_quota():
    # an admin still gets only what a pool offers
    with pytest.raises(OptionsError, match="does not offer 1"):
        resolve_choice(CATALOG, {"gpu": "1", "pool": "a100-mig"}, rule=EVERYONE, admin=True)
    choice = resolve_choice(
        CATALOG, {"gpu": "mig-3g.40gb"}, rule=AccessRule(pools=(), max_gpu=0.0), admin=True
    )
    assert choice.pool.name == "a100-mig"


def test_memory_request_on_mig_pool_resolves_to_smallest_profile():
    choice = resolve_choice(CATALOG, {"gpu": "15GiB", "pool": "a100-mig"}, rule=RESEARCH)
    assert str(choice.offer) == "mig-2g.20gb"
    assert choice.plan.limits == {"nvidia.com/mig-2g.20gb": "1"}


def test_without_pool_the_most_free_pool_wins_ties_in_catalog_order():
    # 1/4 is offered by h100 and t4
    cap = FakeCapacity({("h100", "1/4"): (1, 32), ("t4", "1/4"): (3, 4)})
    assert resolve_choice(CATALOG, {"gpu": "1/4"}, rule=RESEARCH, capacity=cap).pool.name == "t4"
    cap = FakeCapacity({("h100", "1/4"): (3, 32), ("t4", "1/4"): (3, 4)})
    assert resolve_choice(CATALOG, {"gpu": "1/4"}, rule=RESEARCH, capacity=cap).pool.name == "h100"
    # unknown counts rank after known ones
    cap = FakeCapacity({("t4", "1/4"): (1, 4)})
    assert resolve_choice(CATALOG, {"gpu": "1/4"}, rule=RESEARCH, capacity=cap).pool.name == "t4"


def test_full_pool_is_refused_with_what_is_free_instead():
    cap = FakeCapacity(
        {("t4", "1/4"): (0, 4), ("h100", "1/4"): (12, 32), ("h100", "1/8"): (20, 64)}
    )
    with pytest.raises(OptionsError) as info:
        resolve_choice(CATALOG, {"gpu": "1/4", "pool": "t4"}, rule=RESEARCH, capacity=cap)
    message = str(info.value)
    # display names, no pool ids; the same size elsewhere first, then smaller sizes
    assert message == (
        "No 1/4 GPU is free on T4 16GB (time-sliced) right now (all 4 are taken). "
        "Free instead: 1/4 GPU on H100 80GB (HAMi): 12 free; 1/8 GPU on H100 80GB (HAMi): 20 free."
    )
    # admission "wait" lets the pod be created and wait in Pending
    choice = resolve_choice(
        CATALOG, {"gpu": "1/4", "pool": "t4"}, rule=RESEARCH, capacity=cap, admission="wait"
    )
    assert choice.pool.name == "t4"


def test_profile_keys_only_when_a_profile_list_is_configured():
    with pytest.raises(OptionsError, match="Unknown option"):
        resolve_choice(CATALOG, {"gpu": "1/8", "profile": "big"}, rule=EVERYONE)
    choice = resolve_choice(
        CATALOG, {"gpu": "1/8", "profile": "big"}, rule=EVERYONE, extra_keys=("profile",)
    )
    assert str(choice.slice) == "1/8"


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    options=st.dictionaries(
        st.sampled_from(["gpu", "pool", "image", "profile", "env", "x"]) | st.text(max_size=10),
        JSONISH,
        max_size=4,
    ),
    used=st.floats(min_value=0, max_value=4),
)
def test_arbitrary_options_give_a_choice_within_the_rules_or_an_options_error(options, used):
    try:
        choice = resolve_choice(CATALOG, options, rule=EVERYONE, used_gpu=used)
    except OptionsError as exc:
        assert str(exc)
        return
    assert set(options) <= {"gpu", "pool", "image"}
    if choice.pool is not None:
        assert choice.pool.name in EVERYONE.pools
        assert choice.offer in choice.pool.offers
        assert used + choice.plan.gpu_equivalent <= EVERYONE.max_gpu + 1e-9
        assert parse_slice(str(choice.offer)) == choice.offer
