"""Every mistake of a catalog at once, each with its path (and a did-you-mean for typos).

`Catalog.load` stops at the first problem, which is right for a program but costs an admin one
fix-and-run round per mistake. `catalog_problems` walks the whole catalog instead: every schema
error (JSON Schema reports them all), then the checks a schema cannot make, part by part (each
pool, each offer, each access rule, the images), skipping only the parts the schema already
found broken. `fracspawner check CATALOG` prints them; `fracspawner.configure` prints the same
at hub start-up, naming the file.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable, Mapping
from copy import deepcopy
from pathlib import Path
from typing import Any

from .catalog import (
    DEFAULT_IDLE,
    IDLE_KEYS,
    MAX_INTEGER,
    PoolCheck,
    _idle,
    _path,
    _pool,
    _rule,
    build_catalog,
    idle_keys_set_in,
    load_yaml,
    parse_duration,
    validator,
)
from .errors import CatalogError, SliceError
from .gpumodels import GPU_MODELS, lookup_model
from .idle_defaults import frees_usable_memory, why_not_usable
from .slices import gpu_equivalent, parse_slice

__all__ = ["catalog_problems", "catalog_warnings", "did_you_mean", "report"]


def did_you_mean(word: Any, choices: Iterable[str]) -> str:
    """' (did you mean 'h100'?)' for a close match among `choices`, else ''."""
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


#: "unknown backend 'hamii'; known backends: mig-mixed, hami, ..." (the loader's wording)
_UNKNOWN = re.compile(r"unknown [\w ]+ '([^']*)'; [\w ()]+: ([^;]+)$")


def _suggest(message: str) -> str:
    """A loader message naming an unknown name and the known ones, with a did-you-mean."""
    match = _UNKNOWN.search(message)
    if not match or "did you mean" in message:
        return message
    known = [k.strip() for k in match.group(2).split(",")]
    hint = did_you_mean(match.group(1), known)
    return message.replace(f"'{match.group(1)}';", f"'{match.group(1)}'{hint};", 1)


#: JSON Schema types in words, for "must be a number, not a string" (issue 27 #8)
_TYPE_WORDS = {
    "number": "a number",
    "integer": "a whole number",
    "string": "a string",
    "boolean": "true or false",
    "object": "a mapping (key: value)",
    "array": "a list",
}


def _kind_of(value: Any) -> str:
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _type_words(expected: Any, instance: Any) -> str:
    """'must be a number, not a string ('0.25')' instead of JSON Schema's
    "'0.25' is not of type 'number', 'null'"."""
    kinds = [expected] if isinstance(expected, str) else list(expected)
    words = [_TYPE_WORDS.get(k, k) for k in kinds if k != "null"]
    said = " or ".join(words) + (" (or left empty)" if "null" in kinds else "")
    if isinstance(instance, float) and not math.isfinite(instance):  # YAML's .nan, .inf
        return f"must be {said}, not {instance} (no number)"
    if isinstance(instance, int) and not isinstance(instance, bool) and abs(instance) > MAX_INTEGER:
        return f"must be {said}, not a number of {len(str(abs(instance)))} digits"
    if isinstance(instance, float) and "integer" in kinds and "number" not in kinds:
        return f"must be {said}, not {instance!r}" + (
            f" (write {instance:.0f})" if instance.is_integer() else ""
        )
    shown = repr(instance) if not isinstance(instance, Mapping | list) else ""
    return f"must be {said}, not {_kind_of(instance)}" + (f" ({shown})" if shown else "")


def _plain_words(validator: str, limit: Any, instance: Any, schema_words: str) -> str:
    """A person's words for JSON Schema's ("-1 is less than the minimum of 0" -> "must be 0 or
    more, not -1"; issue 38 #5); the schema's own where none are written here."""
    shown = repr(instance) if isinstance(instance, str) else str(instance)
    if validator == "minimum":
        return f"must be {limit} or more, not {shown}"
    if validator == "maximum":
        return f"must be at most {limit}, not {shown}"
    if validator == "exclusiveMinimum":
        return f"must be more than {limit}, not {shown}"
    if validator == "exclusiveMaximum":
        return f"must be less than {limit}, not {shown}"
    if validator == "enum":
        return f"{shown} is not allowed; use one of {', '.join(map(str, limit))}"
    if validator == "const":
        return f"must be {limit!r}, not {shown}"
    if validator == "required":
        missing = [k for k in limit if isinstance(instance, Mapping) and k not in instance]
        return "missing " + ", ".join(f"key {k!r}" for k in missing) + " (required)"
    if validator == "uniqueItems":
        return "lists the same entry more than once"
    if validator == "minItems":
        return "must not be empty" if limit == 1 else f"must list at least {limit} entries"
    if validator == "minLength":
        return "must not be empty" if limit == 1 else f"must be at least {limit} characters"
    if validator == "maxLength":
        return f"must be at most {limit} characters, not {len(instance)}"
    return schema_words


def _either_words(options: Any, instance: Any) -> str | None:
    """What a oneOf/anyOf key takes, in words ("must be 'all' or a list of names, not 'ALL'
    (did you mean 'all'?)"), for JSON Schema's "is not valid under any of the given schemas";
    None where an alternative has no words here."""
    if all(isinstance(o, Mapping) and set(o) == {"required"} for o in options):
        keys = [k for o in options for k in o["required"]]
        return "needs at least one of the keys " + ", ".join(map(repr, keys))
    forms, consts = [], []
    for o in options:
        if not isinstance(o, Mapping):
            return None
        if "const" in o:
            forms.append(repr(o["const"]))
            consts.append(str(o["const"]))
        elif o.get("type") == "array":
            names = (o.get("items") or {}).get("type") == "string"
            forms.append("a list of names" if names else "a list")
        elif o.get("type") == "string":
            forms.append("a name")
        elif "$ref" in o:
            forms.append("a mapping describing a " + o["$ref"].rsplit("/", 1)[-1].replace("_", " "))
        else:
            return None
    if instance is None:
        shown = "left empty"
    else:
        shown = repr(instance) if not isinstance(instance, Mapping | list) else _kind_of(instance)
    lowered = {c.lower(): c for c in consts}
    hint = (
        f" (did you mean {lowered[instance.lower()]!r}?)"
        if isinstance(instance, str) and instance.lower() in lowered
        else did_you_mean(instance, consts)
    )
    return f"must be {' or '.join(forms)}, not {shown}{hint}"


def _idle_problems(raw: Any, prefix: tuple[Any, ...]) -> list[str]:
    """Every idle value of an idle block that is no duration, each with its path (the loader
    stops at the first; issue 38 #5). A typo'd key's value is read as the key it most likely
    means. Values of a wrong type are the schema's to report."""
    if not isinstance(raw, Mapping):
        return []
    found = []
    for key, value in raw.items():
        if key in IDLE_KEYS:
            means = key
        else:
            close = difflib.get_close_matches(str(key), IDLE_KEYS, n=1, cutoff=0.6)
            if not close or close[0] in raw:
                continue
            means = close[0]
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue  # .nan, .inf: no number (the schema's to say)
        try:
            parse_duration(value)
        except ValueError as exc:
            read_as = "" if means == key else f" (read as {means!r})"
            found.append(f"{_path(prefix + (key,))}: {exc}{read_as}")
    return found


def _renamed(data: Any, parent: tuple[Any, ...], key: str, to: str) -> Any:
    """A deep copy of `data` with `key` of the mapping at `parent` renamed `to`."""
    copy = deepcopy(data)
    node = copy
    for step in parent:
        node = node[step]
    node[to] = node.pop(key)
    return copy


def _schema_problems(data: Any, *, _read_as: bool = True) -> list[tuple[tuple[Any, ...], str]]:
    import jsonschema

    found: list[tuple[tuple[Any, ...], str]] = []
    for error in validator().iter_errors(data):
        best = jsonschema.exceptions.best_match([error])
        path = tuple(best.absolute_path)
        message = best.message
        if best.validator == "additionalProperties" and isinstance(best.instance, Mapping):
            known = list((best.schema.get("properties") or {}).keys())
            extra = [k for k in best.instance if k not in known]
            for key in extra:
                found.append(
                    (path + (key,), f"unknown key {key!r}{did_you_mean(key, known)}; keys: "
                     + ", ".join(known))
                )  # fmt: skip
                # a typo'd block's own mistakes now, not after the typo is fixed: check its
                # value as the key it most likely means (when that key is not there too)
                close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
                if _read_as and close and close[0] not in best.instance:
                    again = _schema_problems(_renamed(data, path, key, close[0]), _read_as=False)
                    inner = path + (close[0],)
                    for where, said in again:
                        if where[: len(inner)] == inner:
                            found.append(
                                (path + (key,) + where[len(inner) :],
                                 f"{said} (read as {close[0]!r})")
                            )  # fmt: skip
            continue
        if best.validator == "type":
            message = _type_words(best.validator_value, best.instance)
        elif best.validator == "pattern" and "propertyNames" in str(best.schema_path):
            message = f"{best.instance!r} is not a valid name (letters, digits, '-', '_', '.')"
        elif best.validator in ("oneOf", "anyOf"):
            message = _either_words(best.validator_value, best.instance) or message
        else:
            message = _plain_words(best.validator, best.validator_value, best.instance, message)
        if best.validator == "enum":
            message += did_you_mean(best.instance, [str(v) for v in best.validator_value])
        found.append((path, message))
    # one line per path and message, in the catalog's order of paths
    unique = dict.fromkeys(found)
    return sorted(unique, key=lambda item: tuple(map(str, item[0])))


def catalog_problems(
    data: Any,
    check_pool: PoolCheck | None = None,
    known_backends: Iterable[str] | None = None,
) -> list[str]:
    """Every problem of a catalog dict, each 'path: what is wrong'; [] when it is clean.

    `check_pool` and `known_backends` come from the backends registry (this module, like the
    rest of the model, never imports it)."""
    schema_found = _schema_problems(data)
    problems = [f"{_path(path)}: {message}" for path, message in schema_found]
    broken = [path for path, _ in schema_found]
    if not isinstance(data, Mapping) or not isinstance(data.get("pools"), Mapping):
        return problems

    def spoiled(*prefix: Any) -> bool:
        return any(path[: len(prefix)] == prefix or not path for path in broken)

    def attempt(prefix: tuple[Any, ...], check: Callable[[], Any]) -> Any:
        if spoiled(*prefix):
            return None
        try:
            return check()
        except CatalogError as exc:
            problems.append(_suggest(str(exc)))
        except (KeyError, TypeError, ValueError, AttributeError):
            if not broken:  # a shape the schema let through: a bug, not the admin's mistake
                raise
        return None

    step = data.get("fraction_step", 8) if not spoiled("fraction_step") else 8
    # every bad idle value at once (the loader stops at the first), also beside a typo'd key
    idle_found = _idle_problems(data.get("idle"), ("idle",))
    problems += idle_found
    idle = DEFAULT_IDLE
    if not idle_found:
        idle = attempt(("idle",), lambda: _idle(data.get("idle"), DEFAULT_IDLE, "idle")) or idle
    explicit = idle_keys_set_in(data)
    pool_names = list(data["pools"])
    images = data.get("images") if isinstance(data.get("images"), Mapping) else {}
    for name, raw in data["pools"].items():
        if not isinstance(raw, Mapping):
            continue
        where = f"pools.{name}"
        before = len(problems)
        gpu = raw.get("gpu")
        if isinstance(gpu, str) and lookup_model(gpu) is None:
            problems.append(
                f"{where}.gpu: unknown GPU model {gpu!r}{did_you_mean(gpu, GPU_MODELS)}; "
                f"built-in models: {', '.join(GPU_MODELS)} (or describe it: "
                "{name, memory_mib, nvml_memory_mib, mig_profiles})"
            )
        backend = raw.get("backend")
        if known_backends is not None and isinstance(backend, str) and backend:
            known = list(known_backends)
            if backend not in known:
                problems.append(
                    f"{where}.backend: unknown backend {backend!r}"
                    f"{did_you_mean(backend, known)}; known backends: {', '.join(known)}"
                )
        if not spoiled("pools", name, "offers"):
            for i, value in enumerate(raw.get("offers") or ()):
                try:
                    parse_slice(value, step=step)
                except SliceError as exc:
                    problems.append(f"{where}.offers[{i}]: {exc}")
        default_image = raw.get("default_image")
        if isinstance(default_image, str) and default_image not in images:
            problems.append(
                f"{where}.default_image: unknown image {default_image!r}"
                f"{did_you_mean(default_image, images)}; images: "
                + (", ".join(images) or "none (the catalog has no images section)")
            )
        pool_idle = _idle_problems(raw.get("idle"), ("pools", name, "idle"))
        if pool_idle:  # said here, each; the pool's other checks go on without its idle block
            raw = {k: v for k, v in raw.items() if k != "idle"}
        if len(problems) == before:
            attempt(
                ("pools", name),
                lambda n=name, r=raw: _pool(n, r, step, idle, check_pool, explicit),
            )
        problems += pool_idle
    defaults = [n for n, raw in images.items() if isinstance(raw, Mapping) and raw.get("default")]
    if len(defaults) > 1:
        problems.append(
            f"images.{defaults[1]}.default: only one image may be the default "
            f"({defaults[0]} already is)"
        )
    access = data.get("access") if isinstance(data.get("access"), Mapping) else {}
    rules: list[tuple[tuple[str, ...], Any]] = []
    if "default" in access:
        rules.append((("access", "default"), access["default"]))
    for section in ("groups", "users"):
        for key, raw in (access.get(section) or {}).items():
            rules.append((("access", section, key), raw))
    for prefix, raw in rules:
        if spoiled(*prefix) or not isinstance(raw, Mapping):
            continue
        names = raw.get("pools", "all")
        unknown = (
            [] if names == "all" else [(i, n) for i, n in enumerate(names) if n not in pool_names]
        )
        for i, n in unknown:
            problems.append(
                f"{'.'.join(prefix)}.pools[{i}]: unknown pool {n!r}{did_you_mean(n, pool_names)}; "
                f"pools: {', '.join(pool_names) or 'none'}"
            )
        if not unknown:
            attempt(prefix, lambda r=raw, p=prefix: _rule(r, data["pools"], ".".join(p)))
    if not problems:
        # whatever else the loader checks (Kubeflow mappings, ...): its first word, at least
        attempt((), lambda: build_catalog(data, check_pool))
    return problems


#: per PER_BACKEND setting: what it does, and what it costs where the memory it frees is no one's
_IN_VAIN: dict[str, tuple[str, str]] = {
    "kernel_gpu_hibernate": (
        "hibernation",
        "it only costs host memory",
    ),
    "kernel_gpu_idle": (
        "shutting idle kernels down",
        "it disrupts the user (their kernel and its state are lost) for no co-tenant gain; only "
        "stopping the server (server_gpu_idle) gives the slice back",
    ),
}


def catalog_warnings(data: Any, check_pool: PoolCheck | None = None) -> list[str]:
    """Settings of a clean catalog that cannot help, each 'path: why' ([] when none, or when the
    catalog has problems: those come first). Today: hibernation or idle-kernel shut-downs on a
    pool where the GPU memory they free is usable by no one else (idle_defaults.py)."""
    try:
        catalog = build_catalog(data, check_pool)
    except CatalogError:
        return []
    warnings = _dra_warnings(catalog) + _hami_warnings(catalog)
    for name, pool in catalog.pools.items():
        if frees_usable_memory(pool.backend, pool.overcommit):
            continue
        raw_idle = data["pools"][name].get("idle") or {}
        for key, (what, cost) in _IN_VAIN.items():  # hibernation first: it acts first
            if getattr(catalog.idle_for(name), key) is None:
                continue
            where = f"pools.{name}.idle.{key}" if key in raw_idle else f"idle.{key}"
            warnings.append(
                f"{where}: {what} cannot help on pool {name!r} ({pool.backend}): "
                f"{why_not_usable(pool.backend, key)}; {cost}. Turn it off there "
                f"(pools.{name}.idle.{key}: off)"
            )
    return warnings


#: HAMi's default task slots per GPU (its chart's devicePlugin.deviceSplitCount: "Maximum
#: number of tasks assigned to a single GPU device", Project-HAMi/HAMi charts/hami/values.yaml)
HAMI_SPLIT_COUNT = 10


def _hami_warnings(catalog: Any) -> list[str]:
    """HAMi pools whose smallest slice fits more pods on one GPU, over-commit included, than
    HAMi's default task slots per GPU: past them HAMi schedules no more pods there, whatever
    memory is left, so the last slices of each GPU would never start."""
    warnings = []
    for name, pool in catalog.pools.items():
        if pool.backend != "hami" or not pool.offers:
            continue
        smallest = min(pool.offers, key=lambda s: gpu_equivalent(s, pool.gpu))
        share = gpu_equivalent(smallest, pool.gpu)
        if share <= 0:
            continue
        fits = math.floor(pool.overcommit / share + 1e-9)
        if fits <= HAMI_SPLIT_COUNT:
            continue
        over = f" over-committed {pool.overcommit:g} times" if pool.overcommit != 1 else ""
        warnings.append(
            f"pools.{name}: {fits} slices of {smallest}{over} fit on one GPU, but HAMi "
            f"schedules at most deviceSplitCount pods on a GPU ({HAMI_SPLIT_COUNT} by default): "
            f"set devicePlugin.deviceSplitCount to at least {fits} in HAMi's chart for these "
            f"nodes, or the last {fits - HAMI_SPLIT_COUNT} slices of each GPU never start"
        )
    return warnings


def _dra_warnings(catalog: Any) -> list[str]:
    """DRA pools (backend dra) whose settings leave a gap the admin should know of."""
    warnings = []
    for name, pool in catalog.pools.items():
        if pool.backend != "dra":
            continue
        options = pool.options or {}
        where = f"pools.{name}.options"
        if options.get("sharing") == "unlimited":
            warnings.append(
                f"{where}.sharing: with --consumable-shares=unlimited a claim that asks no "
                "memory books none (the driver's default is 0): other namespaces' claims can "
                "share these GPUs beyond their memory; fracspawner's own claims book their size. "
                "sharing: memory makes every claim book memory"
            )
        warnings += _gate_warnings(name, pool, options)
        if options.get("selectors"):
            warnings.append(
                f"{where}.selectors: the free counts assume these CEL expressions match every "
                "device of the pool (fracspawner evaluates no CEL); a selector that excludes "
                "devices makes the form show more than the scheduler can allocate"
            )
    return warnings


#: GpuConfig sharing strategies and the NVIDIA DRA driver's alpha feature gate each needs
#: (kubernetes-sigs/dra-driver-nvidia-gpu pkg/featuregates/featuregates.go: both default off;
#: api/nvidia.com/resource/v1beta1/validate.go refuses the strategy without its gate)
_GATES = {"time_slicing": ("TimeSlicing", "TimeSlicingSettings"), "mps": ("MPS", "MPSSupport")}


def _gate_warnings(name: str, pool: Any, options: Mapping[str, Any]) -> list[str]:
    """A DRA pool whose claims carry a TimeSlicing or MPS GpuConfig (its offers other than MIG
    profiles: MIG devices take no GpuConfig) needs the driver's feature gate."""
    if not any(offer.kind != "mig" for offer in pool.offers):
        return []
    out = []
    for key, (strategy, gate) in _GATES.items():
        if options.get(key) in (None, False):
            continue
        out.append(
            f"pools.{name}.options.{key}: the claims of pool {name!r} carry a {strategy} "
            f"GpuConfig, which the NVIDIA DRA driver refuses unless its alpha feature gate "
            f"{gate} is on (off by default): the pods would stay in ContainerCreating. Turn it "
            f"on in the driver's Helm values: featureGates: {{{gate}: true}}"
        )
    return out


def report(source: str | Path, problems: list[str], warnings: list[str] | None = None) -> str:
    """The problems of the catalog file `source`, one per line, for a person; the warnings of a
    clean one after the verdict."""
    if not problems:
        if warnings:
            count = "1 warning" if len(warnings) == 1 else f"{len(warnings)} warnings"
            return f"{source}: the catalog is fine, with {count}:\n" + "\n".join(
                f"  warning: {w}" for w in warnings
            )
        return f"{source}: the catalog is fine."
    count = "1 problem" if len(problems) == 1 else f"{len(problems)} problems"
    return f"{source}: {count} in the catalog:\n" + "\n".join(f"  {p}" for p in problems)


def file_problems(
    path: str | Path,
    check_pool: PoolCheck | None = None,
    known_backends: Iterable[str] | None = None,
) -> list[str]:
    """The problems of a catalog file (an unreadable file or bad YAML is the one problem)."""
    try:
        data = load_yaml(Path(path))
    except CatalogError as exc:
        text = str(exc)
        prefix = f"{path}: "
        return [text[len(prefix) :] if text.startswith(prefix) else text]
    return catalog_problems(data, check_pool, known_backends)
