"""Slice parsing, normalising and the GPU model table."""

from __future__ import annotations

import math
import re
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracspawner.model.slices import (
    GPU_MODELS,
    Slice,
    SliceError,
    gpu_equivalent,
    lookup_model,
    parse_slice,
    slice_memory_mib,
)

# a Kubernetes label value: at most 63 of [A-Za-z0-9._-], alphanumeric at both ends
LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


@pytest.mark.parametrize(
    ("value", "canonical", "label"),
    [
        ("1/4", "1/4", "0.25"),
        ("0.25", "1/4", "0.25"),
        (".5", "1/2", "0.5"),
        (" 3/8 ", "3/8", "0.375"),
        ("2/8", "1/4", "0.25"),
        (0.125, "1/8", "0.125"),
        (Fraction(7, 8), "7/8", "0.875"),
        ("10GiB", "10GiB", "10Gi"),
        ("10Gi", "10GiB", "10Gi"),
        ("10G", "10GiB", "10Gi"),
        ("10gb", "10GiB", "10Gi"),
        ("10240MiB", "10GiB", "10Gi"),
        ("1.5GiB", "1536MiB", "1536Mi"),
        ("500Mi", "500MiB", "500Mi"),
        ("mig-1g.10gb", "mig-1g.10gb", "mig-1g.10gb"),
        ("1g.10gb", "mig-1g.10gb", "mig-1g.10gb"),
        ("MIG-3G.40GB", "mig-3g.40gb", "mig-3g.40gb"),
        ("1g.10gb+me", "mig-1g.10gb+me", "mig-1g.10gb.me"),
        ("mig-1g.10gb.me", "mig-1g.10gb+me", "mig-1g.10gb.me"),
        ("1", "1", "1"),
        ("2", "2", "2"),
        (2, "2", "2"),
        ("1.0", "1", "1"),
        ("none", "none", "none"),
        ("None", "none", "none"),
        ("", "none", "none"),
        (None, "none", "none"),
    ],
)
def test_valid_specs_normalise(value, canonical, label):
    s = parse_slice(value)
    assert str(s) == canonical
    assert s.label == label
    assert LABEL_VALUE.match(s.label)
    assert parse_slice(str(s)) == s  # the canonical form reads back to the same slice


def test_equal_specs_compare_equal():
    assert parse_slice("1/4") == parse_slice("0.25") == parse_slice(0.25)
    assert parse_slice("10G") == parse_slice("10240MiB")
    assert parse_slice("1g.10gb") == parse_slice("mig-1g.10gb")
    assert parse_slice("none") == Slice("none")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "not positive"),
        ("0/4", "not positive"),
        ("-1", "not a GPU slice"),
        (-0.25, "not positive"),
        ("1.25", "must be below 1"),
        ("5/4", "must be below 1"),
        ("0.3", "not a multiple of 1/8"),
        ("1/3", "not a multiple of 1/8"),
        ("1/16", "not a multiple of 1/8"),
        (0.1, "not a multiple of 1/8"),
        ("1/0", "division by zero"),
        (float("nan"), "not a number of GPUs"),
        (float("inf"), "not a number of GPUs"),
        (1e300, "at most 16 whole GPUs"),
        ("17", "at most 16 whole GPUs"),
        (10**40, "at most 16 whole GPUs"),
        ("9" * 400, "too long"),
        ("10TiB", "unknown memory unit"),
        ("10 bananas", "unknown memory unit"),
        ("0GiB", "not positive"),
        ("0.0001GiB", "not a whole number of MiB"),
        ("2000000GiB", "more memory than any GPU"),
        ("mig-5g.10gb", "1, 2, 3, 4 or 7 compute slices"),
        ("mig-1g", "not a MIG profile"),
        ("mig-1g.10gb+gfx", "not a MIG profile"),
        ("1g.10gb-me", "not a GPU slice"),
        ("quarter", "not a GPU slice"),
        (True, "not a GPU slice"),
        ([0.25], "must be text, not list"),
        ({"gpu": 1}, "must be text, not dict"),
        (b"1/4", "must be text, not bytes"),
    ],
)
def test_invalid_specs_raise_slice_error_saying_what_is_allowed(value, message):
    with pytest.raises(SliceError, match=re.escape(message)):
        parse_slice(value)


def test_error_message_lists_what_is_allowed():
    with pytest.raises(SliceError) as info:
        parse_slice("quarter")
    assert '"1/4"' in str(info.value) and "mig-1g.10gb" in str(info.value)
    assert "10GiB" in str(info.value) and "none" in str(info.value)


@pytest.mark.parametrize(("step", "ok", "bad"), [(2, "1/2", "1/4"), (16, "1/16", "1/32")])
def test_fraction_step_is_configurable(step, ok, bad):
    assert parse_slice(ok, step=step).kind == "fraction"
    with pytest.raises(SliceError, match=f"1/{step}"):
        parse_slice(bad, step=step)


@pytest.mark.parametrize("step", [0, 1, 3, 5, 32])
def test_fraction_step_must_divide_16(step):
    with pytest.raises(SliceError, match="2, 4, 8, 16"):
        parse_slice("1/2", step=step)


def test_max_whole_is_configurable():
    assert parse_slice("4", max_whole=4).count == 4
    with pytest.raises(SliceError, match="at most 4"):
        parse_slice("5", max_whole=4)


SPEC_TEXT = st.one_of(
    st.text(max_size=30),
    st.from_regex(r"\A(mig-)?[0-9]g\.[0-9]{1,3}gb(\+me)?\Z"),
    st.from_regex(r"\A[0-9]{1,4}(\.[0-9]{1,3})?\s?(GiB|Gi|G|MiB|Mi|M|TiB|gb)\Z"),
    st.from_regex(r"\A[0-9]{1,3}\s?/\s?[0-9]{1,3}\Z"),
)
ANY_VALUE = st.one_of(
    SPEC_TEXT,
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.fractions(),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=600, deadline=None)
@given(value=ANY_VALUE, step=st.sampled_from([2, 4, 8, 16]))
def test_any_value_parses_or_raises_slice_error_only(value, step):
    try:
        s = parse_slice(value, step=step)
    except SliceError as exc:
        assert str(exc)
        return
    # whatever parses is a well-formed slice with a label-safe, re-parseable form
    assert s.kind in ("none", "fraction", "memory", "mig", "whole")
    assert LABEL_VALUE.match(s.label) and len(s.label) <= 63
    assert parse_slice(str(s), step=step) == s
    if s.kind == "fraction":
        assert 0 < s.fraction < 1 and (s.fraction * step).denominator == 1
    if s.kind == "whole":
        assert 1 <= s.count <= 16
    if s.kind == "memory":
        assert 0 < s.memory_mib <= 1024 * 1024


# ------------------------------------------------------------------------------ GPU models
# NVIDIA MIG user guide, "Supported MIG Profiles": (model, profile, max instances, memory GB)
MIG_FACTS = [
    ("A100-40GB", "1g.5gb", 7, 5),
    ("A100-40GB", "1g.5gb+me", 1, 5),
    ("A100-40GB", "1g.10gb", 4, 10),
    ("A100-40GB", "2g.10gb", 3, 10),
    ("A100-40GB", "3g.20gb", 2, 20),
    ("A100-40GB", "4g.20gb", 1, 20),
    ("A100-40GB", "7g.40gb", 1, 40),
    ("A100-80GB", "1g.10gb", 7, 10),
    ("A100-80GB", "1g.20gb", 4, 20),
    ("A100-80GB", "2g.20gb", 3, 20),
    ("A100-80GB", "3g.40gb", 2, 40),
    ("A100-80GB", "7g.80gb", 1, 80),
    ("A30-24GB", "1g.6gb", 4, 6),
    ("A30-24GB", "2g.12gb", 2, 12),
    ("A30-24GB", "2g.12gb+me", 1, 12),
    ("A30-24GB", "4g.24gb", 1, 24),
    ("H100-80GB", "1g.10gb", 7, 10),
    ("H100-80GB", "1g.20gb", 4, 20),
    ("H100-80GB", "3g.40gb", 2, 40),
    ("H100-NVL-94GB", "1g.12gb", 7, 12),
    ("H100-NVL-94GB", "3g.47gb", 2, 47),
    ("H100-NVL-94GB", "7g.94gb", 1, 94),
    ("H200-141GB", "1g.18gb", 7, 18),
    ("H200-141GB", "1g.35gb", 4, 35),
    ("H200-141GB", "3g.71gb", 2, 71),
    ("H200-141GB", "7g.141gb", 1, 141),
]


@pytest.mark.parametrize(("model", "profile", "max_instances", "gb"), MIG_FACTS)
def test_mig_profile_table(model, profile, max_instances, gb):
    p = GPU_MODELS[model].mig_profiles[profile]
    assert p.max_instances == max_instances
    assert p.memory_mib == gb * 1024
    assert p.compute_slices == int(profile[0])


def test_models_required_by_the_design_exist_with_aliases():
    for name in ("A100-40GB", "A100-80GB", "A30-24GB", "H100-80GB", "H100-NVL-94GB", "H200-141GB"):
        assert GPU_MODELS[name].mig_profiles
    for name in ("L4", "L40S", "T4", "A10"):
        assert not GPU_MODELS[name].mig_profiles
    assert lookup_model("a30") is GPU_MODELS["A30-24GB"]
    assert lookup_model("H100") is GPU_MODELS["H100-80GB"]
    assert lookup_model("V100") is None


def test_every_mig_layout_fits_the_models_compute_slices():
    for model in GPU_MODELS.values():
        for p in model.mig_profiles.values():
            assert p.compute_slices <= model.mig_compute_slices
            assert (
                p.compute_slices * p.max_instances <= model.mig_compute_slices
                or p.name.startswith("1g.")
            )
            assert p.memory_mib <= model.memory_mib


def test_every_built_in_model_has_its_nvml_memory():
    # the real total is a little off the nominal figure, never far: a typo would show here
    for model in GPU_MODELS.values():
        assert model.nvml_memory_mib is not None, model.name
        assert 0.9 < model.nvml_memory_mib / model.memory_mib < 1.05, model.name
    assert GPU_MODELS["H100-80GB"].device_memory_mib == 81559


H100 = GPU_MODELS["H100-80GB"]
A30 = GPU_MODELS["A30-24GB"]


@pytest.mark.parametrize(
    ("spec", "equivalent", "memory"),
    [
        # fractions are shares of the 81559 MiB NVML reports, so four quarters fit
        ("1/4", 0.25, 20389),
        ("1/8", 0.125, 10194),
        # memory sizes mean what they say; for quotas they count against the nominal 80 GiB
        ("10GiB", 0.125, 10240),
        ("20GiB", 0.25, 20480),
        ("mig-1g.10gb", 1 / 7, 10240),
        ("mig-3g.40gb", 3 / 7, 40960),
        ("2", 2.0, 2 * 81559),
        ("none", 0.0, 0),
    ],
)
def test_gpu_equivalent_and_memory(spec, equivalent, memory):
    s = parse_slice(spec)
    assert math.isclose(gpu_equivalent(s, H100), equivalent)
    assert slice_memory_mib(s, H100) == memory


@pytest.mark.parametrize(
    ("spec", "equivalent"),
    [("mig-1g.6gb", 1 / 4), ("mig-2g.12gb", 1 / 2), ("mig-4g.24gb", 1.0)],
)
def test_a30_profiles_count_out_of_its_four_compute_slices(spec, equivalent):
    assert A30.mig_compute_slices == 4
    assert math.isclose(gpu_equivalent(parse_slice(spec), A30), equivalent)


def test_mig_profile_unknown_to_the_model_is_a_slice_error():
    with pytest.raises(SliceError, match="L4 has no MIG profile 1g.10gb"):
        gpu_equivalent(parse_slice("mig-1g.10gb"), GPU_MODELS["L4"])
