"""The catalog: GPU pools and their offers, images, access rules and idle policy.

`Catalog.load` takes a YAML path or a dict (the same structure), validates it against the JSON
Schema shipped next to this module (`catalog.schema.json`) and then checks what a schema cannot
say (a MIG profile the GPU lacks, unknown pool names in access rules, image defaults). What only
a backend knows (an offer its technology cannot serve) is checked by the `check_pool` callable
the caller passes; `fracspawner.backends.load_catalog` passes the registry's, so this pure model
never imports the backends. Every problem raises `CatalogError` with a message that starts
with the path of the offending key: `pools.h100.offers[3]: "0.3" is not a multiple of 1/8`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

import yaml

from .errors import CatalogError, SliceError
from .gpumodels import GpuModel, MigProfile, lookup_model
from .idle_defaults import KERNEL_GPU_IDLE_DEFAULT, PER_BACKEND, backend_default
from .profiles import KubeflowAccess, parse_kubeflow
from .slices import Slice, parse_slice

SCHEMA_PATH = Path(__file__).with_name("catalog.schema.json")


# --------------------------------------------------------------------------- data
@dataclass(frozen=True)
class IdlePolicy:
    """Idle limits in seconds; None turns a check off (docs/catalog.md, docs/culler.md)."""

    kernel_gpu_idle: float | None = None
    server_gpu_idle: float | None = None
    server_idle: float | None = None
    max_age: float | None = None
    # no user activity (GPU work does not count) for this long stops a server even while its
    # GPU is busy: a neighbour's work on a shared GPU or a forgotten job cannot hold it for ever
    server_unattended: float | None = None
    # the first rung: an idle GPU kernel's CUDA state is suspended to host memory (the CUDA
    # driver's checkpoint API, in the server: fracspawner/serverext/hibernate.py) and resumed
    # on its next message; it frees GPU memory without ending the kernel
    kernel_gpu_hibernate: float | None = None


IDLE_KEYS = (
    "kernel_gpu_idle",
    "server_gpu_idle",
    "server_idle",
    "max_age",
    "server_unattended",
    "kernel_gpu_hibernate",
)

#: What a catalog without an `idle` section (or a key left out of it) gets: never "never cull".
#: server_gpu_idle is z2jh's culler timeout (1 h): holding a slice idle longer is worse than the
#: baseline. kernel_gpu_idle and kernel_gpu_hibernate left unset are decided per pool by its
#: backend (idle_defaults.py: 30 and 10 min where the GPU memory an idle kernel frees is usable
#: by others, off elsewhere); catalog-wide (a server whose pool is unknown) 30 min and off.
DEFAULT_IDLE = IdlePolicy(
    kernel_gpu_idle=KERNEL_GPU_IDLE_DEFAULT,
    server_gpu_idle=3600.0,
    server_idle=8 * 3600.0,
    max_age=None,
    server_unattended=24 * 3600.0,
    kernel_gpu_hibernate=None,
)


@dataclass(frozen=True)
class Image:
    name: str
    display_name: str
    image: str
    default: bool
    description: str = ""


@dataclass(frozen=True)
class AccessRule:
    pools: tuple[str, ...] | None = None  # None: every pool
    max_gpu: float | None = None  # GPU-equivalents across a user's servers; None: unlimited


@dataclass(frozen=True)
class Pool:
    name: str
    display_name: str
    description: str
    gpu: GpuModel
    backend: str
    node_selector: Mapping[str, str] = field(hash=False)
    tolerations: tuple[Mapping[str, Any], ...] = field(hash=False)
    offers: tuple[Slice, ...]
    replicas: int | None
    options: Mapping[str, Any] = field(hash=False)
    default_image: str | None = None
    idle: IdlePolicy | None = None  # this pool's policy (catalog idle with the pool's overrides)
    #: GPU memory committed as a multiple of the GPU's (1: none). What a slice entitles to is
    #: unchanged (a "1/4" is a quarter of the GPU's memory); `overcommit` times as many fit on
    #: a GPU, and the culler keeps what is resident within the GPU by swapping idle kernels out
    #: (culler/pressure.py). Each backend says whether and how it can (Backend.check_overcommit)
    overcommit: float = 1.0


@dataclass(frozen=True)
class Catalog:
    pools: Mapping[str, Pool] = field(hash=False)
    images: Mapping[str, Image] = field(hash=False)
    access_default: AccessRule
    access_groups: Mapping[str, AccessRule] = field(hash=False)
    access_users: Mapping[str, AccessRule] = field(hash=False)
    idle: IdlePolicy
    fraction_step: int = 8
    #: Kubeflow profile namespaces -> access groups (fracspawner.model.profiles)
    kubeflow: KubeflowAccess = field(default=KubeflowAccess(), hash=False)

    @classmethod
    def load(
        cls,
        source: str | os.PathLike[str] | Mapping[str, Any],
        check_pool: PoolCheck | None = None,
    ) -> Catalog:
        """Load a catalog from a YAML file path or a dict; raise CatalogError naming the path.

        Without `check_pool` no backend looks at the pools: use
        `fracspawner.backends.load_catalog` wherever a catalog is served."""
        if isinstance(source, (str, os.PathLike)):
            data: Any = load_yaml(Path(source))
        else:
            data = source  # a dict; anything else fails the schema check with a message
        return build_catalog(data, check_pool)

    def rule_for(self, username: str, groups: Iterable[str]) -> AccessRule:
        """A users entry wins; else the union of the user's group rules; else the default."""
        if username in self.access_users:
            return self.access_users[username]
        rules = [self.access_groups[g] for g in groups if g in self.access_groups]
        if not rules:
            return self.access_default
        if any(r.pools is None for r in rules):
            pools: tuple[str, ...] | None = None
        else:
            names = {p for r in rules for p in r.pools or ()}
            pools = tuple(n for n in self.pools if n in names)  # catalog order
        if any(r.max_gpu is None for r in rules):
            max_gpu = None
        else:
            max_gpu = max(r.max_gpu for r in rules if r.max_gpu is not None)
        return AccessRule(pools=pools, max_gpu=max_gpu)

    def default_image(self, pool: Pool | None) -> Image | None:
        """The pool's default image, else the catalog's default (first image if none marked)."""
        if pool is not None and pool.default_image:
            return self.images[pool.default_image]
        for image in self.images.values():
            if image.default:
                return image
        return next(iter(self.images.values()), None)

    def idle_for(self, pool_name: str | None) -> IdlePolicy:
        """The idle policy of a pool (its overrides on the catalog's); the catalog's otherwise."""
        pool = self.pools.get(pool_name) if pool_name else None
        if pool is not None and pool.idle is not None:
            return pool.idle
        return self.idle


class PoolCheck(Protocol):
    def __call__(self, pool: Pool, where: str) -> None:
        """Raise CatalogError (message starting with `where`) if no backend can serve `pool`."""


# --------------------------------------------------------------------------- durations
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(s|m|h|d|w)?\s*$", re.IGNORECASE)
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: object) -> float | None:
    """'90s', '30m', '2h', '1d', '1w' or seconds -> seconds; 0, 'off', '' or None -> None (off)."""
    if text is None or isinstance(text, bool):
        if text is None:
            return None
        raise ValueError(f"{text!r} is not a duration; use e.g. 30m, 2h, 1d or 0 for off")
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        value = str(text).strip()
        if value.lower() in ("", "off", "none", "never"):
            return None
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"{text!r} is not a duration; use e.g. 90s, 30m, 2h, 1d or 0 for off")
        seconds = float(match.group(1)) * _SECONDS[(match.group(2) or "s").lower()]
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        raise ValueError(f"{text!r} is not a duration; use e.g. 30m, 2h, 1d or 0 for off")
    return seconds or None


# --------------------------------------------------------------------------- YAML
class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one). Keys a
    merge key (`<<: *base`) brings in are no duplicates: a key written beside it overrides
    them, as YAML's merge key means."""


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:  # the keys as written, before the merge brings any in
        if key_node.tag == _MERGE_TAG:
            continue
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key_node, (yaml.SequenceNode, yaml.MappingNode)):
            # `? [a, b]`: a list or mapping as a key, which no catalog key can be (and which
            # Python cannot hash: a TypeError here, a traceback, before)
            kind = "list" if isinstance(key_node, yaml.SequenceNode) else "mapping"
            line = key_node.start_mark.line + 1
            raise CatalogError(f"a key is a {kind}, not a name (line {line})")
        if key in seen:
            line = key_node.start_mark.line + 1
            raise CatalogError(f"duplicate key {key!r} (line {line})")
        seen[key] = True
    return loader.construct_mapping(node, deep=deep)  # merges (flatten_mapping), then builds


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,  # type: ignore[arg-type]
)


def _unreadable_scalar(tag: str, what: str) -> None:
    """A scalar YAML resolves to `tag` whose constructor raises ValueError (2024-13-45 is a
    date to YAML; Python reads no integer of more than 4,300 digits): a problem naming its
    line, not a ValueError out of yaml.load."""
    constructor = _UniqueKeyLoader.yaml_constructors[tag]

    def construct(loader: _UniqueKeyLoader, node: yaml.ScalarNode) -> Any:
        try:
            return constructor(loader, node)
        except ValueError as exc:
            line = node.start_mark.line + 1
            if tag.endswith(":int"):
                said = f"a number of {len(node.value)} characters, too long to read"
            else:
                said = f"{node.value!r} is {what} ({exc}); quote it to write text"
            raise CatalogError(f"line {line}: {said}") from None

    _UniqueKeyLoader.add_constructor(tag, construct)


_unreadable_scalar("tag:yaml.org,2002:int", "no number")
_unreadable_scalar("tag:yaml.org,2002:timestamp", "a date to YAML, but none")


def load_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read the catalog: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise CatalogError(f"{path}: {not_utf8(exc)}") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except CatalogError as exc:
        raise CatalogError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: not valid YAML: {exc}") from None


def not_utf8(exc: UnicodeDecodeError) -> str:
    """'not UTF-8 text (byte 0xe9 on line 6); ...' for a file that is not UTF-8 (YAML's own)."""
    data = exc.object if isinstance(exc.object, bytes) else bytes(exc.object)
    line = data.count(b"\n", 0, exc.start) + 1
    return f"not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line}); save the file as UTF-8"


# --------------------------------------------------------------------------- validation
@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The catalog's JSON Schema (shipped in the package)."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


#: the largest whole number a catalog may hold (Kubernetes' int64); anything beyond is a typo
MAX_INTEGER = 2**63 - 1


def _is_number(_checker: Any, value: Any) -> bool:
    """JSON's numbers: YAML's .nan and .inf are none (JSON cannot even write them), nor is
    an integer too large for a float (an OverflowError wherever it is used)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) <= MAX_INTEGER
    return isinstance(value, float) and math.isfinite(value)


def _is_integer(_checker: Any, value: Any) -> bool:
    """Whole numbers as written: `replicas: 4.0` is refused, not read as 4 here and as 4.0
    (a label "4.0", a TypeError of Fraction) further on."""
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_INTEGER


@lru_cache(maxsize=1)
def validator() -> Any:
    """The catalog schema's validator, with the number types above (the loader's and
    `fracspawner check`'s)."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine_many({"number": _is_number, "integer": _is_integer})
    return jsonschema.validators.extend(base, type_checker=checker)(schema())


def _path(parts: Iterable[Any]) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(catalog)"


def _schema_check(data: Any) -> None:
    import jsonschema

    errors = sorted(validator().iter_errors(data), key=lambda e: (len(e.absolute_path), e.message))
    if not errors:
        return
    # the deepest error is the most specific one (oneOf reports its branches below it)
    best = jsonschema.exceptions.best_match(errors)
    message = best.message
    if best.validator == "additionalProperties" and "unexpected)" in message:
        message = message.replace("Additional properties are not allowed", "unknown key(s)")
    elif (
        best.validator == "pattern"
        and best.absolute_path
        and "propertyNames" in str(best.schema_path)
    ):
        message = f"{best.instance!r} is not a valid name (letters, digits, '-', '_', '.')"
    raise CatalogError(f"{_path(best.absolute_path)}: {message}")


def _idle(raw: Mapping[str, Any] | None, base: IdlePolicy, where: str) -> IdlePolicy:
    values = {}
    for key in IDLE_KEYS:
        if raw is not None and key in raw:
            try:
                values[key] = parse_duration(raw[key])
            except ValueError as exc:
                raise CatalogError(f"{where}.{key}: {exc}") from None
        else:
            values[key] = getattr(base, key)
    return IdlePolicy(**values)


def _gpu_model(raw: Any, where: str) -> GpuModel:
    if isinstance(raw, str):
        model = lookup_model(raw)
        if model is None:
            from .gpumodels import GPU_MODELS

            raise CatalogError(
                f"{where}: unknown GPU model {raw!r}; built-in models: {', '.join(GPU_MODELS)} "
                "(or describe it: {name, memory_mib, nvml_memory_mib, mig_profiles})"
            )
        return model
    profiles: dict[str, MigProfile] = {}
    slices = int(raw.get("mig_compute_slices", 7))
    for name, spec in (raw.get("mig_profiles") or {}).items():
        try:
            parsed = parse_slice(f"mig-{name}")
        except SliceError as exc:
            raise CatalogError(f"{where}.mig_profiles.{name}: {exc}") from None
        assert parsed.profile is not None
        compute = int(parsed.profile.split("g.", 1)[0])
        if "compute_slices" in spec and spec["compute_slices"] != compute:
            raise CatalogError(
                f"{where}.mig_profiles.{name}.compute_slices: {spec['compute_slices']} "
                f"contradicts the profile name ({compute} compute slices)"
            )
        if compute > slices:
            raise CatalogError(
                f"{where}.mig_profiles.{name}: {compute} compute slices, but the GPU has "
                f"{slices} (mig_compute_slices)"
            )
        if parsed.profile in profiles:
            raise CatalogError(f"{where}.mig_profiles.{name}: duplicate profile {parsed.profile}")
        profiles[parsed.profile] = MigProfile(
            name=parsed.profile,
            compute_slices=compute,
            memory_mib=int(spec["memory_mib"]),
            max_instances=int(spec.get("max_instances", slices // compute)),
            sms=spec.get("sms"),
        )
    return GpuModel(
        name=str(raw.get("name") or "custom"),
        memory_mib=int(raw["memory_mib"]),
        sms=raw.get("sms"),
        mig_profiles=MappingProxyType(profiles),
        product=raw.get("product"),
        nvml_memory_mib=raw.get("nvml_memory_mib"),
        mig_compute_slices=slices,
    )


def _pool(
    name: str,
    raw: Mapping[str, Any],
    step: int,
    idle: IdlePolicy,
    check: PoolCheck | None,
    explicit: Iterable[str] = (),
) -> Pool:
    """One pool; `explicit`: the PER_BACKEND keys the catalog's idle section sets itself (the
    pool's backend decides the others' defaults: idle_defaults.py)."""
    where = f"pools.{name}"
    gpu = _gpu_model(raw["gpu"], f"{where}.gpu")
    offers: list[Slice] = []
    for i, value in enumerate(raw["offers"]):
        try:
            offer = parse_slice(value, step=step)
        except SliceError as exc:
            raise CatalogError(f"{where}.offers[{i}]: {exc}") from None
        if offer.kind == "none":
            raise CatalogError(f"{where}.offers[{i}]: 'none' is not a GPU offer")
        if offer in offers:
            raise CatalogError(f"{where}.offers[{i}]: duplicate offer {offer}")
        offers.append(offer)
    pool = Pool(
        name=name,
        display_name=raw.get("display_name") or name,
        description=raw.get("description", ""),
        gpu=gpu,
        backend=raw["backend"],
        node_selector=MappingProxyType(dict(raw.get("node_selector") or {})),
        tolerations=tuple(MappingProxyType(dict(t)) for t in raw.get("tolerations") or ()),
        offers=tuple(offers),
        replicas=raw.get("replicas"),
        options=MappingProxyType(dict(raw.get("options") or {})),
        default_image=raw.get("default_image"),
        idle=_pool_idle(raw, idle, where, explicit),
        overcommit=float(raw.get("overcommit", 1)),
    )
    if check is not None:
        check(pool, where)
    return pool


def _pool_idle(
    raw: Mapping[str, Any], idle: IdlePolicy, where: str, explicit: Iterable[str]
) -> IdlePolicy | None:
    """The pool's idle policy where it differs from the catalog's (None: the catalog's). A
    PER_BACKEND key set neither catalog-wide nor on the pool gets its backend's default."""
    own = _idle(raw["idle"], idle, f"{where}.idle") if "idle" in raw else None
    pool_keys = raw["idle"] if isinstance(raw.get("idle"), Mapping) else {}
    base = own or idle
    backend, overcommit = str(raw["backend"]), float(raw.get("overcommit", 1))
    changed: dict[str, float | None] = {}
    for key in PER_BACKEND:
        if key in explicit or key in pool_keys:
            continue  # the catalog says: its word wins
        value = backend_default(key, backend, overcommit)
        if value != getattr(base, key):
            changed[key] = value
    return dataclasses.replace(base, **changed) if changed else own


def idle_keys_set_in(data: Any) -> frozenset[str]:
    """The PER_BACKEND keys a catalog dict's idle section sets itself."""
    idle = data.get("idle") if isinstance(data, Mapping) else None
    return frozenset(k for k in PER_BACKEND if isinstance(idle, Mapping) and k in idle)


def _rule(raw: Mapping[str, Any] | None, pools: Mapping[str, Pool], where: str) -> AccessRule:
    if raw is None:
        return AccessRule()
    if "pools" not in raw and "max_gpu" not in raw:
        return AccessRule()
    names = raw.get("pools", "all")
    if names == "all":
        chosen = None
    else:
        for i, n in enumerate(names):
            if n not in pools:
                raise CatalogError(
                    f"{where}.pools[{i}]: unknown pool {n!r}; pools: {', '.join(pools) or 'none'}"
                )
        chosen = tuple(names)
    max_gpu = raw.get("max_gpu")
    return AccessRule(pools=chosen, max_gpu=None if max_gpu is None else float(max_gpu))


def build_catalog(data: Any, check_pool: PoolCheck | None = None) -> Catalog:
    """Validate a catalog dict (schema, then semantics) and build the Catalog."""
    _schema_check(data)
    step = data.get("fraction_step", 8)
    idle = _idle(data.get("idle"), DEFAULT_IDLE, "idle")

    explicit = idle_keys_set_in(data)
    pools = {
        name: _pool(name, raw, step, idle, check_pool, explicit)
        for name, raw in data["pools"].items()
    }

    images: dict[str, Image] = {}
    defaults = []
    # no images: fracspawner sets none, and the spawner's configured image stays in force
    for name, raw in (data.get("images") or {}).items():
        images[name] = Image(
            name=name,
            display_name=raw.get("display_name") or name,
            image=raw["image"],
            default=bool(raw.get("default", False)),
            description=raw.get("description", ""),
        )
        if images[name].default:
            defaults.append(name)
    if len(defaults) > 1:
        raise CatalogError(
            f"images.{defaults[1]}.default: only one image may be the default "
            f"({defaults[0]} already is)"
        )
    for name, pool in pools.items():
        if pool.default_image is not None and pool.default_image not in images:
            raise CatalogError(
                f"pools.{name}.default_image: unknown image {pool.default_image!r}; "
                f"images: {', '.join(images) or 'none (the catalog has no images section)'}"
            )

    access = data.get("access")
    if access is None:
        default = AccessRule()  # no access section: everyone may take everything
    elif "default" not in access:
        # an access section without a default must not hand everything to everyone else
        default = AccessRule(pools=(), max_gpu=0.0)
    else:
        default = _rule(access["default"], pools, "access.default")
    access = access or {}
    return Catalog(
        pools=MappingProxyType(pools),
        images=MappingProxyType(images),
        access_default=default,
        access_groups=MappingProxyType(
            {
                g: _rule(r, pools, f"access.groups.{g}")
                for g, r in (access.get("groups") or {}).items()
            }
        ),
        access_users=MappingProxyType(
            {
                u: _rule(r, pools, f"access.users.{u}")
                for u, r in (access.get("users") or {}).items()
            }
        ),
        idle=idle,
        kubeflow=parse_kubeflow(data.get("kubeflow"), access.get("groups") or {}, pools),
        fraction_step=step,
    )
