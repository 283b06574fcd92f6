"""Who may take what: the pools a rule allows and quota arithmetic in GPU-equivalents."""

from __future__ import annotations

from .catalog import AccessRule, Catalog, Pool

#: Quota comparisons tolerate float noise from summing fractions like 1/8 + 1/8 + ...
EPSILON = 1e-9


def allowed_pools(catalog: Catalog, rule: AccessRule, *, admin: bool = False) -> list[Pool]:
    """Pools this user may spawn on, in catalog order."""
    if admin or rule.pools is None:
        return list(catalog.pools.values())
    return [p for name, p in catalog.pools.items() if name in rule.pools]


def within_quota(rule: AccessRule, used: float, adding: float) -> bool:
    """Whether `adding` GPU-equivalents on top of `used` stay within the rule's max_gpu."""
    return rule.max_gpu is None or used + adding <= rule.max_gpu + EPSILON


def quota_left(rule: AccessRule, used: float) -> float | None:
    """GPU-equivalents still available under the rule (None: no limit)."""
    return None if rule.max_gpu is None else max(rule.max_gpu - used, 0.0)
