"""Names and words Kubeflow shows for a catalog offer. Pure.

The PodDefault name is the Helm chart's (charts/fracspawner/templates/kubeflow-poddefaults.yaml):
`fracspawner-<pool>-<offer label>`, lower case, '.' and '_' as '-', at most 52 characters, so
objects the chart and `fracspawner kubeflow export` write for one catalog are the same objects,
with the same `desc` (words the chart's template can compute too).
"""

from __future__ import annotations

import hashlib
import re

from ..backends.base import PodPlan
from ..choice.offers import BACKEND_NAMES
from ..model.catalog import Pool
from ..model.slices import Slice

#: the namespace label every Kubeflow profile namespace carries (profile controller's base
#: namespace-labels; also the namespaceSelector of Kubeflow's own PodDefault webhook)
PROFILE_LABEL = ("app.kubernetes.io/part-of", "kubeflow-profile")
#: the Notebook CR annotation that stops a notebook (Kubeflow's JWA PATCH route and culler)
STOP_ANNOTATION = "kubeflow-resource-stopped"
_NOT_DNS = re.compile(r"[^a-z0-9-]")
#: Kubeflow's PodDefault webhook records each PodDefault it applied as the pod annotation
#: `poddefault.admission.kubeflow.org/poddefault-<name>` (kubeflow/dashboard
#: components/poddefaults-webhooks/main.go, applyPodDefaultsOnPod); an annotation key's name part
#: is at most 63 characters, so a longer PodDefault name makes every pod it selects fail to be
#: created. 63 - len("poddefault-") = 52.
MAX_PODDEFAULT_NAME = 52
#: a name cut to fit keeps this many characters, then '-' and 6 hex digits of the full name's
#: sha256 (so two long names that share a beginning stay apart)
_CUT = MAX_PODDEFAULT_NAME - 7


def poddefault_name(pool: str, offer: Slice) -> str:
    """`fracspawner-h100-0-25`: a DNS label of at most 52 characters, also the selector label
    key the form sets."""
    name = f"fracspawner-{pool}-{offer.label}".lower().replace(".", "-").replace("_", "-")
    name = _NOT_DNS.sub("-", name)
    if len(name) <= MAX_PODDEFAULT_NAME:
        return name.removesuffix("-")
    digest = hashlib.sha256(name.encode()).hexdigest()[:6]
    return f"{name[:_CUT].removesuffix('-')}-{digest}"


def podconfig_id(pool: str, offer: Slice) -> str:
    """The Notebooks 2.0 podConfig id of an offer (the same words as the PodDefault name)."""
    return poddefault_name(pool, offer)


def _gib(mib: int) -> str:
    gib = mib / 1024
    return f"{gib:.0f} GiB" if abs(gib - round(gib)) < 0.05 else f"{gib:.1f} GiB"


def _article(word: str) -> str:
    # model names are read letter by letter: "an H100", "an L40S", "a T4"
    return "an" if word[:1].upper() in "AEFHILMNORSX" else "a"


def offer_words(pool: Pool, offer: Slice) -> str:
    """'1/4 of an H100-80GB', '10GiB of an H100-80GB', 'MIG 1g.10gb of an A100-80GB',
    '2 × A10'."""
    model = pool.gpu.name
    if offer.kind in ("fraction", "memory"):
        return f"{offer} of {_article(model)} {model}"
    if offer.kind == "mig":
        return f"MIG {offer.profile} of {_article(model)} {model}"
    return f"{offer.count} × {model}"


def poddefault_desc(pool: Pool, offer: Slice) -> str:
    """What the notebook form lists under "Configurations": 'H100 80GB (HAMi) · GPU 0.25',
    'H100 80GB (HAMi) · GPU memory 10Gi', 'A100 (MIG) · MIG 1g.10gb', 'L4 · 2 GPUs'. Built from
    the pool's display name and the offer's label only, so the Helm chart's template writes
    the same words (charts/fracspawner/templates/kubeflow-poddefaults.yaml)."""
    # decided on the label's form, as the template can
    label = offer.label
    if label.startswith("mig-"):
        words = "MIG " + label.removeprefix("mig-")
    elif label.endswith(("Gi", "Mi")):
        words = f"GPU memory {label}"
    elif label.isdigit():
        words = f"{label} GPU" if label == "1" else f"{label} GPUs"
    else:
        words = f"GPU {label}"
    return f"{pool.display_name} · {words}"


def describe(pool: Pool, offer: Slice, plan: PodPlan) -> str:
    """What the form shows: '1/4 of an H100-80GB · 20 GiB · HAMi'."""
    parts = [offer_words(pool, offer)]
    if offer.kind != "memory":  # a memory offer says its size already
        parts.append(_gib(plan.memory_mib))
    if offer.kind not in ("mig", "whole"):  # MIG and whole GPUs say it in the words already
        parts.append(BACKEND_NAMES.get(pool.backend, pool.backend))
    return " · ".join(parts)
