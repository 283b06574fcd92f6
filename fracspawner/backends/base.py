"""PodPlan (what a GPU slice puts on a pod) and the Backend base class.

A backend maps a Slice on a Pool to the Kubernetes keys ONE sharing technology expects, and
counts how many more of an offer fit on the cluster the way that technology's scheduler books
them. Both are pure: no I/O, no spawner state. `fracspawner.backends.plan_slice` adds what every
GPU pod carries (the CONTRACT labels and annotations, soft caps, the pool's node selector).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from ..model.errors import SliceError
from ..model.slices import Slice
from .fit import CountedOffer, OfferCounter, count_resources

if TYPE_CHECKING:
    from ..model.catalog import Pool


@dataclass(frozen=True)
class PodPlan:
    """Everything a slice puts on a pod. Plain data; the spawner applies it onto its traits."""

    limits: Mapping[str, str] = field(default_factory=dict, hash=False)
    requests: Mapping[str, str] = field(default_factory=dict, hash=False)
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    annotations: Mapping[str, str] = field(default_factory=dict, hash=False)
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    node_selector: Mapping[str, str] = field(default_factory=dict, hash=False)
    tolerations: tuple[Mapping[str, Any], ...] = field(default=(), hash=False)
    scheduler_name: str | None = None
    image: str | None = None
    #: camelCase pod spec keys, as kubespawner's extra_pod_config (e.g. {"hostPID": True})
    extra_pod_config: Mapping[str, Any] = field(default_factory=dict, hash=False)
    extra_container_config: Mapping[str, Any] = field(default_factory=dict, hash=False)
    gpu_equivalent: float = 0.0
    memory_mib: int = 0
    notes: tuple[str, ...] = ()
    #: whether the backend hard-isolates GPU memory (a process cannot exceed memory_mib)
    enforced: bool = False
    #: Kubernetes DRA: entries of the GPU container's `resources.claims` (the pod's
    #: `spec.resourceClaims` go in extra_pod_config), and the ResourceClaimTemplates they
    #: name (manifests without a namespace: made in the server's namespace)
    container_claims: tuple[Mapping[str, Any], ...] = field(default=(), hash=False)
    claim_templates: tuple[Mapping[str, Any], ...] = field(default=(), hash=False)


@dataclass(frozen=True)
class OptionKind:
    """What a pool option takes: `accepts(value)`, and in words for the message."""

    words: str
    accepts: Callable[[Any], bool]


#: true or false, not the string "no" (which bool() reads as true)
FLAG = OptionKind("true or false", lambda v: isinstance(v, bool))
#: a name (a queue, a resource, a product): a non-empty string
TEXT = OptionKind("a non-empty string", lambda v: isinstance(v, str) and v.strip() != "")
#: values the backend's own check_pool checks (with its own message)
CHECKED = OptionKind("", lambda v: True)
#: every backend's: the pod's schedulerName (plan_slice)
COMMON_OPTIONS: Mapping[str, OptionKind] = MappingProxyType({"scheduler_name": TEXT})


def gpu_limit(count: int | str = 1, resource: str = "nvidia.com/gpu") -> dict[str, str]:
    return {resource: str(count)}


class Backend:
    """One GPU-sharing technology. Subclasses set the class attributes and `plan`."""

    name: ClassVar[str] = ""
    #: does the technology hard-limit GPU memory to the slice?
    enforces_memory: ClassVar[bool] = False
    #: the Slice kinds it can serve: "fraction", "memory", "mig", "whole"
    modes: ClassVar[frozenset[str]] = frozenset()
    #: one line for docs and errors
    summary: ClassVar[str] = ""
    #: the pool options it reads besides COMMON_OPTIONS: any other key of a pool's `options`
    #: is refused, as a typo would otherwise be ignored. None: not said (a third party's
    #: backend), every key is let through
    pool_options: ClassVar[Mapping[str, OptionKind] | None] = None

    def check_pool(self, pool: Pool) -> None:
        """Raise ValueError if the pool's settings cannot work with this backend."""

    def check_offer(self, s: Slice, pool: Pool) -> None:
        """Raise SliceError if this backend cannot serve `s` on `pool`."""
        if s.kind not in self.modes:
            kinds = ", ".join(sorted(self.modes))
            raise SliceError(f"{s}: the {self.name} backend serves only {kinds} slices")
        if s.kind == "mig":
            assert s.profile is not None
            pool.gpu.mig_profile(s.profile)  # raises SliceError naming the model's profiles
        if s.kind == "memory":
            assert s.memory_mib is not None
            if s.memory_mib >= pool.gpu.device_memory_mib:
                raise SliceError(
                    f"{s}: a {pool.gpu.name} has {pool.gpu.device_memory_mib} MiB; "
                    'offer whole GPUs ("1") instead of all of its memory'
                )

    #: why this technology cannot over-commit GPU memory (catalog `overcommit` above 1); ""
    #: where it can (then `check_overcommit` says what else it needs)
    cannot_overcommit: ClassVar[str] = (
        "fracspawner does not know how its scheduler could book more GPU memory than a GPU has"
    )

    def check_overcommit(self, pool: Pool) -> None:
        """Raise ValueError (the reason, for the catalog's `overcommit` key) when the pool's
        over-commit cannot work with this technology; an `overcommit` of 1 always can."""
        if pool.overcommit != 1 and self.cannot_overcommit:
            raise ValueError(
                f"the {self.name} backend cannot over-commit GPU memory: {self.cannot_overcommit}"
            )

    def enforced(self, pool: Pool) -> bool:
        """Whether GPU memory is hard-limited on this pool (a pool option may say so)."""
        return self.enforces_memory

    def plan(self, s: Slice, pool: Pool) -> PodPlan:
        """The backend-specific keys for `s` on `pool` (check_offer has passed)."""
        raise NotImplementedError

    #: a caveat shown with counts from the default counting
    count_note: ClassVar[str] = ""
    #: pod labels and annotations, node annotations its counting reads (a trailing '*' is a
    #: prefix): the capacity watches keep only these, not whole objects
    count_pod_labels: ClassVar[tuple[str, ...]] = ()
    count_pod_annotations: ClassVar[tuple[str, ...]] = ()
    count_node_annotations: ClassVar[tuple[str, ...]] = ()

    def counter(self, offer: CountedOffer) -> OfferCounter:
        """How `offer` is counted, node by node (fracspawner.backends.fit.OfferCounter). By
        default what the plan puts in limits, against node allocatable (kube-scheduler's
        NodeResourcesFit)."""
        return count_resources(offer, self.count_note)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def option(pool: Pool, key: str, default: Any = None) -> Any:
    """A backend setting from the pool's `options` mapping."""
    return pool.options.get(key, default) if pool.options else default


def decimal(value: float) -> str:
    """Plain decimal text with a point: 0.25 -> '0.25', 1/3 -> '0.333333'."""
    text = f"{value:.6f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def plugin_replicas(pool: Pool) -> int:
    """How many times the device plugin advertises each GPU of a replica pool: the catalog's
    `replicas` (the slice is 1/replicas of the GPU) times its `overcommit`. With `replicas: 4,
    overcommit: 2` the plugin runs with replicas 8: eight servers of a quarter each share a GPU,
    and the scheduler, the node's `nvidia.com/gpu.replicas` label and the capacity count all
    see eight. check_overcommit makes sure the product is a whole number."""
    return round((pool.replicas or 1) * pool.overcommit)


class ReplicaBackend(Backend):
    """A device plugin that advertises each GPU `replicas` times: one replica is the only
    fraction (1/replicas) a pool can offer (NVIDIA time-slicing/MPS, GKE sharing)."""

    modes = frozenset({"fraction"})
    #: the most replicas the technology allows per GPU
    max_replicas: ClassVar[int] = 0
    #: what `replicas` must match, for the message
    replicas_of: ClassVar[str] = "the device plugin's replicas"
    #: nothing isolates memory: more replicas than the slice's share over-commit it
    cannot_overcommit = ""

    def check_pool(self, pool: Pool) -> None:
        high = self.max_replicas
        if not pool.replicas or pool.replicas < 2 or (high and pool.replicas > high):
            span = f"2-{high}" if high else "2 or more"
            raise ValueError(
                f"replicas: set it to {self.replicas_of} ({span}); "
                "the only fraction such a pool offers is 1/replicas"
            )

    def check_overcommit(self, pool: Pool) -> None:
        super().check_overcommit(pool)
        if pool.overcommit == 1 or not pool.replicas:
            return
        total = pool.replicas * pool.overcommit
        if abs(total - round(total)) > 1e-9:
            raise ValueError(
                f"replicas x overcommit ({pool.replicas} x {pool.overcommit:g}) must be a whole "
                f"number: it is {self.replicas_of} on the pool's nodes"
            )
        high = self.max_replicas
        if high and round(total) > high:
            raise ValueError(
                f"replicas x overcommit is {round(total)}, above the {high} clients per GPU "
                f"{self.name} allows"
            )

    def check_offer(self, s: Slice, pool: Pool) -> None:
        super().check_offer(s, pool)
        if pool.replicas and s.fraction != Fraction(1, pool.replicas):
            raise SliceError(
                f"{s}: a {self.name} pool with replicas {pool.replicas} can only offer "
                f"1/{pool.replicas}"
            )
