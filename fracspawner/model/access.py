"""Who may take what: the pools a rule allows and quota arithmetic in GPU-equivalents."""

from __future__ import annotations

from collections.abc import Mapping

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


def namespace_rule(
    catalog: Catalog,
    name: str,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> AccessRule:
    """The rule of a Kubeflow profile namespace: its `kubeflow.namespaces` groups combined as
    for a user in those groups (no `users` entry applies), limited to `kubeflow.pools`.
    Its max_gpu caps the GPU-equivalents of all the namespace's pods together."""
    kubeflow = catalog.kubeflow
    groups = kubeflow.groups_for(name, labels or {}, annotations or {})
    rule = catalog.access_default
    if groups:
        rules = [catalog.access_groups[g] for g in groups]
        if any(r.pools is None for r in rules):
            pools: tuple[str, ...] | None = None
        else:
            names = {p for r in rules for p in r.pools or ()}
            pools = tuple(n for n in catalog.pools if n in names)
        limits = [r.max_gpu for r in rules]
        max_gpu = (
            None if any(m is None for m in limits) else max(m for m in limits if m is not None)
        )
        rule = AccessRule(pools=pools, max_gpu=max_gpu)
    if kubeflow.pools is not None:
        allowed = rule.pools if rule.pools is not None else tuple(catalog.pools)
        rule = AccessRule(
            pools=tuple(p for p in allowed if p in kubeflow.pools), max_gpu=rule.max_gpu
        )
    return rule
