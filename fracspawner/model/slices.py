"""GPU slice specs: parse what a user or admin writes ("1/4", "10GiB", "mig-1g.10gb", "2").

Pure functions only. `parse_slice` is the one gate every `gpu` value passes through (form,
REST `user_options`, catalog offers), so it is strict: anything it does not understand raises
`SliceError` with a message saying what is allowed, never another exception.

Fraction steps: fractions must be multiples of 1/step where step divides 16 (2, 4, 8 or 16).
16 is the finest because the finest fixed grid a sharing technology offers is ClearML's
injector (0.0625 = 1/16), and capacity counts in sixteenths stay exact.

The GPU model table lives in `gpumodels.py`; it is re-exported here, as is `SliceError`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from numbers import Real

from .errors import SliceError, quote
from .gpumodels import GPU_MODELS, GpuModel, MigProfile, lookup_model

__all__ = [
    "ALLOWED_STEPS",
    "GPU_MODELS",
    "GpuModel",
    "MigProfile",
    "Slice",
    "SliceError",
    "gpu_equivalent",
    "lookup_model",
    "parse_slice",
    "slice_memory_mib",
]

#: steps a catalog may use for fractions (`fraction_step`); each divides 16
ALLOWED_STEPS = (2, 4, 8, 16)
#: no GPU has a TiB of memory yet; anything above is a typo or an attack on the parser
MAX_MEMORY_MIB = 1024 * 1024
#: longer inputs are never a valid spec; refusing early keeps parsing O(1)
_MAX_LEN = 40

_MIG = re.compile(r"^(?:mig-)?([1-7])g\.([1-9][0-9]{0,3})gb(?:([+.])me)?$", re.IGNORECASE)
_MEMORY = re.compile(r"^([0-9]{1,7}(?:\.[0-9]{1,4})?)\s*([a-z]+)$", re.IGNORECASE)
_DECIMAL = re.compile(r"^[0-9]{0,3}(?:\.[0-9]{1,6})?$")
_RATIO = re.compile(r"^([0-9]{1,3})\s*/\s*([0-9]{1,3})$")
_WHOLE = re.compile(r"^[0-9]{1,3}$")
# "G" and "GB" mean GiB here, as in MIG profile names ("1g.10gb") and GPU marketing.
_UNITS_MIB = {
    "gib": 1024,
    "gi": 1024,
    "g": 1024,
    "gb": 1024,
    "mib": 1,
    "mi": 1,
    "m": 1,
    "mb": 1,
}

ALLOWED_HELP = (
    'a fraction like "1/4" or "0.25", GPU memory like "10GiB" or "10240MiB", '
    'a MIG profile like "mig-1g.10gb", whole GPUs like "1", or "none"'
)


@dataclass(frozen=True)
class Slice:
    """One GPU slice, normalised: equal specs compare equal ("1/4" == "0.25")."""

    kind: str  # "none" | "fraction" | "memory" | "mig" | "whole"
    fraction: Fraction | None = None
    memory_mib: int | None = None
    profile: str | None = None  # canonical "1g.10gb" or "1g.10gb+me"
    count: int = 0

    @property
    def label(self) -> str:
        """Kubernetes label-value safe form: "0.25", "10Gi", "mig-1g.10gb.me", "1", "none"."""
        if self.kind == "fraction":
            assert self.fraction is not None
            return _decimal(self.fraction)
        if self.kind == "memory":
            assert self.memory_mib is not None
            mib = self.memory_mib
            return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"
        if self.kind == "mig":
            assert self.profile is not None
            return "mig-" + self.profile.replace("+", ".")  # '+' is not allowed in label values
        if self.kind == "whole":
            return str(self.count)
        return "none"

    def __str__(self) -> str:
        """Canonical spec, accepted back by parse_slice: "1/4", "10GiB", "mig-1g.10gb"."""
        if self.kind == "fraction":
            assert self.fraction is not None
            return f"{self.fraction.numerator}/{self.fraction.denominator}"
        if self.kind == "memory":
            assert self.memory_mib is not None
            mib = self.memory_mib
            return f"{mib // 1024}GiB" if mib % 1024 == 0 else f"{mib}MiB"
        if self.kind == "mig":
            return f"mig-{self.profile}"
        if self.kind == "whole":
            return str(self.count)
        return "none"

    @property
    def is_gpu(self) -> bool:
        return self.kind != "none"


NONE = Slice("none")


def _q(value: object) -> str:
    """Quote a user's value for a message: text in double quotes ("0.3"), others as repr;
    never more than ECHO_MAX characters of it."""
    return quote(value)


def _decimal(f: Fraction) -> str:
    """Exact decimal of a fraction with a power-of-two denominator: 1/8 -> '0.125'."""
    text = f"{float(f):.6f}".rstrip("0").rstrip(".")
    return text or "0"


def _check_step(step: int) -> None:
    if step not in ALLOWED_STEPS:
        raise SliceError(f"fraction step must be one of {', '.join(map(str, ALLOWED_STEPS))}")


def _fraction_slice(value: Fraction, raw: object, step: int, max_whole: int) -> Slice:
    if value <= 0:
        raise SliceError(f"{_q(raw)} is not positive; use {ALLOWED_HELP}")
    if value.denominator == 1:
        return _whole_slice(value.numerator, raw, max_whole)
    if value > 1:
        raise SliceError(
            f"{_q(raw)}: a fraction must be below 1 and more than one GPU must be whole GPUs "
            f'("1", "2", ...)'
        )
    if (value * step).denominator != 1:
        raise SliceError(f"{_q(raw)} is not a multiple of 1/{step}")
    return Slice("fraction", fraction=value)


def _whole_slice(n: int, raw: object, max_whole: int) -> Slice:
    if n < 1:
        raise SliceError(f"{_q(raw)} is not positive; use {ALLOWED_HELP}")
    if n > max_whole:
        raise SliceError(f"{_q(raw)}: at most {max_whole} whole GPUs")
    return Slice("whole", count=n)


def _parse_number(value: Real, step: int, max_whole: int) -> Slice:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SliceError(f"{_q(value)} is not a number of GPUs; use {ALLOWED_HELP}")
        if abs(value) > 1e6:
            raise SliceError(f"{_q(value)}: at most {max_whole} whole GPUs")
        # repr() is the shortest round-tripping text: 0.1 -> Fraction(1, 10), not 0.1000...055
        return _fraction_slice(Fraction(repr(value)), value, step, max_whole)
    n = int(value)  # int and other integral Reals
    if n != value:
        return _fraction_slice(Fraction(value), value, step, max_whole)  # type: ignore[arg-type]
    return _whole_slice(n, value, max_whole)


def parse_slice(value: object, *, step: int = 8, max_whole: int = 16) -> Slice:
    """Parse a `gpu` value; raise SliceError (only) for anything that is not a valid slice.

    - fraction: "1/4", "0.25", ".5", 0.25 — 0 < f < 1, a multiple of 1/step
    - memory: "10GiB", "10Gi", "10G", "10GB", "10240MiB", "1.5GiB" — G and GB mean GiB
    - MIG: "mig-1g.10gb", "1g.10gb", "1g.10gb+me" (also "mig-1g.10gb.me", the resource form)
    - whole GPUs: "1", "2", 2 — up to max_whole
    - no GPU: "none", "", None
    """
    _check_step(step)
    if isinstance(value, Slice):
        return value
    if value is None:
        return NONE
    if isinstance(value, bool):  # bool is an int subclass; True is not "1 GPU"
        raise SliceError(f"{_q(value)} is not a GPU slice; use {ALLOWED_HELP}")
    if isinstance(value, Real):
        return _parse_number(value, step, max_whole)
    if not isinstance(value, str):
        kind = type(value).__name__
        raise SliceError(f"a GPU slice must be text, not {kind}; use {ALLOWED_HELP}")
    return _parse_text(value, step, max_whole)


#: the texts a hub sees are its offers' few spellings; anything else only costs a parse
_PARSED_TEXTS = 256


@lru_cache(maxsize=_PARSED_TEXTS)
def _parse_text(value: str, step: int, max_whole: int) -> Slice:
    """parse_slice of a text (every spawn parses its `gpu` option: memoized; a Slice is
    frozen, and errors are raised again each time, not cached)."""
    text = value.strip()
    if len(text) > _MAX_LEN:
        raise SliceError(f"{_q(text)} is too long; use {ALLOWED_HELP}")
    if text == "" or text.lower() == "none":
        return NONE
    if _WHOLE.match(text):
        return _whole_slice(int(text), value, max_whole)
    if _DECIMAL.match(text) and text != ".":
        return _fraction_slice(Fraction(text), value, step, max_whole)
    ratio = _RATIO.match(text)
    if ratio:
        numerator, denominator = int(ratio.group(1)), int(ratio.group(2))
        if denominator == 0:
            raise SliceError(f"{_q(value)}: division by zero")
        return _fraction_slice(Fraction(numerator, denominator), value, step, max_whole)
    mig = _MIG.match(text)
    if mig:
        compute, memory, me = mig.groups()
        if compute not in ("1", "2", "3", "4", "7"):
            raise SliceError(f"{_q(value)}: MIG profiles have 1, 2, 3, 4 or 7 compute slices")
        return Slice("mig", profile=f"{compute}g.{memory}gb" + ("+me" if me else ""))
    memory = _MEMORY.match(text)
    if memory:
        amount, unit = memory.groups()
        factor = _UNITS_MIB.get(unit.lower())
        if factor is None:
            raise SliceError(f"{_q(value)}: unknown memory unit {unit!r}; use GiB or MiB")
        mib = Fraction(amount) * factor
        if mib.denominator != 1:
            raise SliceError(f"{_q(value)} is not a whole number of MiB")
        if mib <= 0:
            raise SliceError(f"{_q(value)} is not positive; use {ALLOWED_HELP}")
        if mib > MAX_MEMORY_MIB:
            raise SliceError(f"{_q(value)} is more memory than any GPU has")
        return Slice("memory", memory_mib=int(mib))
    if text.lower().startswith("mig-"):
        raise SliceError(
            f"{_q(value)} is not a MIG profile; MIG profiles look like mig-1g.10gb "
            "or mig-1g.10gb+me"
        )
    raise SliceError(f"{_q(value)} is not a GPU slice; use {ALLOWED_HELP}")


def gpu_equivalent(s: Slice, model: GpuModel) -> float:
    """How much of one GPU the slice counts as (for quotas): a MIG profile's compute slices
    out of the model's own (7, or 4 on an A30), a memory size out of the nominal memory."""
    if s.kind == "fraction":
        assert s.fraction is not None
        return float(s.fraction)
    if s.kind == "whole":
        return float(s.count)
    if s.kind == "memory":
        assert s.memory_mib is not None
        return min(s.memory_mib / model.memory_mib, 1.0)
    if s.kind == "mig":
        assert s.profile is not None
        return model.mig_profile(s.profile).compute_slices / model.mig_compute_slices
    return 0.0


def slice_memory_mib(s: Slice, model: GpuModel) -> int:
    """GPU memory (MiB) the slice entitles to. Fractions and whole GPUs are shares of the memory
    the device really has (NVML's total: 1/4 of an H100 is 20389 MiB, so four fit), memory
    sizes are what they say, MIG profiles count their nominal size."""
    if s.kind == "fraction":
        assert s.fraction is not None
        return math.floor(model.device_memory_mib * s.fraction)
    if s.kind == "whole":
        return model.device_memory_mib * s.count
    if s.kind == "memory":
        assert s.memory_mib is not None
        return s.memory_mib
    if s.kind == "mig":
        assert s.profile is not None
        return model.mig_profile(s.profile).memory_mib
    return 0
