"""Amounts in the units people think in: GPU shares as fractions ("1/8", "1 6/7"), memory in GiB.

Pure formatting, shared by the quota line, offer reasons and refusal messages, so the page and
the API's messages show the same numbers.
"""

from __future__ import annotations

from datetime import UTC, datetime
from fractions import Fraction

__all__ = ["gib", "gpu_amount", "gpu_share", "slice_text", "utc_minute"]

#: denominators a catalog produces: fraction steps (2..16) and MIG sevenths (A100/H100 profiles),
#: and their sums (1/7 + 1/8 = 15/56)
_MAX_DENOMINATOR = 112
_TOLERANCE = 1e-5  # the API rounds to 6 decimals


def gpu_share(value: float) -> str:
    """'1/8', '1 6/7', '2', or a rounded decimal ('0.33') when no small fraction fits."""
    if value < _TOLERANCE:
        return "0"
    frac = Fraction(value).limit_denominator(_MAX_DENOMINATOR)
    if abs(float(frac) - value) > _TOLERANCE or (frac.denominator > 16 and frac.denominator != 7):
        # sums like 15/56 read worse than a decimal
        return f"{value:.2f}".rstrip("0").rstrip(".")
    whole, rest = divmod(frac.numerator, frac.denominator)
    if rest == 0:
        return str(whole)
    part = f"{rest}/{frac.denominator}"
    return f"{whole} {part}" if whole else part


def gpu_amount(value: float) -> str:
    """'1/8 GPU', '2 GPUs', '1 6/7 GPUs'."""
    text = gpu_share(value)
    return f"{text} GPU" + ("s" if value > 1 + _TOLERANCE else "")


def gib(mib: int) -> str:
    """'10 GiB', '9.5 GiB' (one space, as in every message and label)."""
    value = mib / 1024
    return f"{value:.0f} GiB" if abs(value - round(value)) < 0.05 else f"{value:.1f} GiB"


def slice_text(
    kind: str, *, fraction: str = "", memory_mib: int = 0, profile: str = "", count: int = 0
) -> str:
    """A slice in plain words: '1/4 GPU', '10 GiB', 'MIG 1g.10gb', '2 GPUs', 'no GPU'."""
    if kind == "fraction":
        return f"{fraction} GPU"
    if kind == "memory":
        return gib(memory_mib)
    if kind == "mig":
        return f"MIG {profile}"
    if kind == "whole":
        return f"{count} GPU" + ("s" if count > 1 else "")
    return "no GPU"


def utc_minute(ts: float | None) -> str:
    """A Unix time as '2026-11-25 18:54 UTC' (admins read one clock everywhere); '' if None."""
    return "" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")
