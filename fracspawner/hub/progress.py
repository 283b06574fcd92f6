"""Spawn progress in a person's words, with Kubernetes' own words kept for the event log.

kubespawner turns each pod event into a progress message such as
`2026-11-23T10:00:00Z [Normal] Successfully assigned jhub/jupyter-uma to gpu-h100-0`. The
pending page shows the newest message under its progress bar, so that line is what a user
reads while waiting. `human_step` says the same step in the user's terms (their slice, the
image's display name); `progress_event` puts both into the event: `message` is the plain
sentence (REST clients of `/hub/api/users/:name/server/progress` read it), `html_message` is
the sentence plus the original text in a `fs-raw` span, which our pending-page template hides
under the progress bar and JupyterHub's "Event log" shows (on a hub without that template the
line simply shows both).

Event reasons are the kubelet's and the scheduler's (Kubernetes pkg/kubelet/events/event.go,
pkg/scheduler: Scheduled, FailedScheduling, Pulling, Pulled, Created, Started, Killing,
BackOff, Failed, FailedMount, Unhealthy ...); an unknown reason keeps its own message.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

__all__ = [
    "NodeAutoscaling",
    "gpus_unoffered",
    "human_step",
    "is_autoscaler_event",
    "node_autoscaling",
    "node_coming",
    "node_may_mend",
    "pod_events",
    "pod_failure",
    "progress_event",
    "scheduler_absent",
    "scheduling_trouble",
    "scheduling_wait",
]

#: what an administrator is asked for when a server cannot start by itself
_FOR_ADMIN = "This is for an administrator to fix: choose another image, or tell them."


def _event_time(event: Mapping[str, Any]) -> str:
    # kubespawner's order (EventReflector.events): lastTimestamp, else eventTime (RFC 3339
    # strings of one format, so they sort as times)
    return event.get("lastTimestamp") or event.get("eventTime") or ""


def pod_events(
    events: Iterable[Mapping[str, Any]], pod_name: str, after_uid: str | None
) -> list[Mapping[str, Any]]:
    """The events of pod `pod_name`, oldest first, after the last one whose uid is
    `after_uid` (the marker kubespawner's `_start` sets: an earlier pod's events stay out).

    What kubespawner's `KubeSpawner.events` returns, but it sorts every event the hub holds
    (every pod of the namespace) on each read, `_start` once and `progress()` every second
    per pending spawn; this picks the pod's events first and sorts only those. Python's sort
    is stable, so the order of equal times is the same either way."""
    mine = [e for e in events if e["involvedObject"]["name"] == pod_name]
    mine.sort(key=_event_time)
    if after_uid:
        for i in range(len(mine) - 1, -1, -1):
            if mine[i]["metadata"]["uid"] == after_uid:
                return mine[i + 1 :]
    return mine


def human_step(raw: Mapping[str, Any], *, slice_words: str = "", image: str = "") -> str:
    """One sentence for one pod event. `slice_words` e.g. '1/8 GPU on H100 80GB (HAMi)';
    `image` the image's display name ('' when none was chosen)."""
    reason = str(raw.get("reason") or "")
    message = str(raw.get("message") or "").strip()
    the_image = f"the image {image}" if image else "the image"
    if reason == "Scheduled":
        if slice_words:
            return f"Your {slice_words} is reserved; preparing your server."
        return "A node has room for your server; preparing it."
    if reason == "Pulling":
        return f"Downloading {the_image} (the first start on a node can take a few minutes)."
    if reason == "Pulled":
        return f"{the_image[0].upper()}{the_image[1:]} is ready."
    if reason == "Created":
        return "Your server's container is created."
    if reason == "Started":
        return "Your server has started; waiting for Jupyter to answer."
    if reason == "Killing":
        return "Your server is being stopped."
    if reason == "FailedMount":
        return "A storage volume is not attached yet; Kubernetes keeps trying."
    if reason == "BackOff":
        if "pull" in message.lower():
            return f"{the_image[0].upper()}{the_image[1:]} could not be downloaded; retrying."
        return "Your server stopped right after starting; Kubernetes is retrying."
    if reason == "Failed" and _is_pull_error(message):
        # 'Failed to pull image "..."', 'Error: ErrImagePull', 'Error: ImagePullBackOff'
        return f"{the_image[0].upper()}{the_image[1:]} could not be downloaded; retrying."
    if reason in ("Failed", "ErrImageNeverPull", "InspectFailed"):
        return f"Your server could not start: {message}" if message else "Your server failed."
    if reason == "Unhealthy":
        return "Your server is not answering its health check yet."
    if (autoscaling := _autoscaler_event(raw)) is not None:
        if autoscaling.adding:
            return node_coming(autoscaling)
        return f"No node is being added for your server ({autoscaling.who}: {autoscaling.detail})."
    if raw.get("type") == "Warning":
        return f"Kubernetes reports a problem ({reason}): {message}" if reason else message
    return message or reason


def progress_event(event: Mapping[str, Any], sentence: str) -> dict[str, Any]:
    """kubespawner's event with `sentence` as its message and the original kept for the log.
    Both parts are escaped: event text comes from the cluster, never trusted as markup."""
    original = str(event.get("message") or "")
    markup = f'<span class="fs-step">{html.escape(sentence)}</span>'
    if original and original != sentence:
        markup += f' <span class="fs-raw">({html.escape(original)})</span>'
    return {**event, "message": sentence, "html_message": markup}


def _is_pull_error(message: str) -> bool:
    lowered = message.lower()
    return "pull" in lowered or "errimage" in lowered or "invalidimagename" in lowered


# ---------------------------------------------------------------- a pod that will not start
#: a failed pull that no retry mends: the image is not there, or the node may not fetch it
_HOPELESS_PULL = (
    (
        # Docker Hub answers the same for a repository that does not exist and a private one
        # the node has no credentials for (containerd: "pull access denied, repository does
        # not exist or may require authorization"): say both, not the first half
        re.compile(r"may require authori[sz]ation", re.I),
        "it does not exist in its registry, or the registry refused to send it (no access)",
    ),
    (
        re.compile(r"not found|manifest unknown|does not exist|name unknown", re.I),
        "it does not exist in its registry",
    ),
    (
        re.compile(r"unauthori[sz]ed|denied|forbidden|authenticat|\b40[13]\b", re.I),
        "its registry refused to send it (no access)",
    ),
    (
        re.compile(r"invalid reference|invalid image|couldn't parse image", re.I),
        "its name is not a valid image name",
    ),
)


#: a container runtime's words for a command that is not in the image
#: (runc's `exec: "cmd": executable file not found in $PATH`, or `stat /path: no such file or
#: directory` for a path; quotes escaped where the runtime's log line is quoted again)
_NO_PROGRAM = re.compile(
    r'exec: \\?"[^"]*?\\?":\s*(executable file not found|stat [^:]+: no such file or directory)'
)


def _statuses(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = pod.get("status") or {}
    found = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    return [s for s in found if isinstance(s, Mapping)]


def pod_failure(
    pod: Mapping[str, Any] | None, *, image: str = "", main: str = "notebook"
) -> str | None:
    """Why `pod` can never start by itself, in the user's words (what happened and what to do),
    or None. `image`: the display name of the server's image; `main`: its container's name.

    The kubelet retries a pull and restarts a crashing container (kubespawner's pods are
    `restartPolicy: OnFailure`) for ever, and kubespawner waits for the pod to run until
    `start_timeout`: an image that is not in its registry, or a server that exits at once
    (an image without jupyterhub-singleuser), kept the user on the pending page for minutes
    and then said only "Timeout". A pull that failed for another reason (a registry's rate
    limit, the network) may pass on the kubelet's next try: not a failure here."""
    if not pod:
        return None
    for status in _statuses(pod):
        waiting = (status.get("state") or {}).get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        message = str(waiting.get("message") or "")
        name = str(status.get("name") or "")
        if name == main:
            what = (
                f"The image {image} ({status.get('image')})"
                if image
                else f"The image {status.get('image')}"
            )
        else:
            what = f"The image {status.get('image')} of your server's {name!r} container"
        why = None
        if reason == "InvalidImageName":
            why = "its name is not a valid image name"
        elif reason == "ErrImageNeverPull":
            why = "it is not on the node, and the pod may not download it"
        elif reason in ("ErrImagePull", "ImagePullBackOff"):
            why = next((w for pattern, w in _HOPELESS_PULL if pattern.search(message)), None)
        if why is not None:
            return f"{what} could not be downloaded: {why}. {_FOR_ADMIN}"
        if reason == "CrashLoopBackOff":
            return _crash_words(status, image, main=name == main)
        if reason in ("CreateContainerError", "RunContainerError") and _NO_PROGRAM.search(message):
            # CRI-O refuses to create a container whose command is not in the image (containerd
            # starts it and it ends with StartError, exit 128: a crash loop, above); the kubelet
            # tries again for ever and the image does not change
            who = "Your server" if name == main else f"Your server's {name!r} container"
            named = f"the image {image}" if image and name == main else "its image"
            return (
                f"{who} cannot start: a program it runs is missing from {named}"
                + (" (is jupyterhub-singleuser installed?)" if name == main else "")
                + f". {_FOR_ADMIN}"
            )
    return None


def _crash_words(status: Mapping[str, Any], image: str, *, main: bool) -> str:
    ended = ((status.get("lastState") or {}).get("terminated")) or {}
    code = ended.get("exitCode")
    cause = str(ended.get("reason") or "")
    text = str(ended.get("message") or "")
    who = "Your server" if main else f"Your server's {status.get('name')!r} container"
    if cause == "OOMKilled":
        return (
            f"{who} ran out of memory while starting, again after each restart. Choose a size "
            "with more memory if the form offers one, or tell an administrator."
        )
    said = f" (exit code {code})" if code is not None else ""
    hint = ""
    if main and (code == 127 or "executable file not found" in text or "no such file" in text):
        named = f"the image {image}" if image else "its image"
        hint = f" A program it runs is missing from {named} (is jupyterhub-singleuser installed?)."
    return (
        f"{who} stopped right after starting{said}, and again each time Kubernetes restarted "
        f"it.{hint} {_FOR_ADMIN}"
    )


# the scheduler's reasons ("0/5 nodes are available: 1 Insufficient cpu, 4 node(s) didn't
# match Pod's node affinity/selector. preemption: ...") that are not about a GPU
_RESOURCES = re.compile(
    r"^(Insufficient (cpu|memory|ephemeral-storage|pods|hugepages-\S+)|Too many pods)$"
)
_STORAGE = re.compile(r"volume|persistentvolumeclaim", re.I)
_PLACEMENT = re.compile(r"taint|affinity|selector|were unschedulable|free ports", re.I)
# kube-scheduler v1.36's DRA plugin (pkg/scheduler/framework/plugins/dynamicresources/
# dynamicresources.go). A wait, left to the GPU words: Filter's "cannot allocate all claims" (no
# device of the node fits now) and "resourceclaim not available on the node" (allocated on
# another), PreFilter's "resourceclaim in use" and "resource claim <c> is in the process of being
# allocated". Not one, each UnschedulableAndUnresolvable and unchanged until an administrator acts:
# PreFilter's validateDeviceClass "request <r>: device class <c> does not exist" (the pod sleeps
# until a DeviceClass event), "resource claim <c>, request <r>: has subrequests, but the
# DRAPrioritizedList feature is disabled" and "...: unknown request type"; and Filter's
# "invalid resource pools were encountered" (k8s.io/dynamic-resource-allocation structured
# allocator: the driver's ResourceSlices fail validation, duplicate devices or counters).
_DRA_NO_CLASS = re.compile(r"^request \S+: device class (\S+) does not exist$")
_DRA_UNREADABLE = re.compile(
    r"^resource claim \S+, request \S+: (has subrequests, but the DRAPrioritizedList feature "
    r"is disabled|unknown request type)$"
)
_DRA_INVALID = re.compile(r"^invalid resource pools were encountered$")


def _scheduling_kinds(message: str) -> tuple[set[str], str] | None:
    """The kinds of the scheduler's reasons in `message` and the device class a DRA claim
    names, or None where any reason may be the GPU or the message is not the usual one."""
    # the Filter reasons end at the first '.' followed by a space or the end (PostFilter
    # plugins' words follow: "still not schedulable, preemption: ..."); names hold '.' alone
    found = re.search(r"nodes are available: (.*?)\.(?=\s|$)", message or "", re.S)
    if not found:
        return None
    items = [re.sub(r"^\d+\s+", "", i.strip()) for i in re.split(r",\s*(?=\d+ )", found.group(1))]
    kinds = set()
    device_class = ""
    for item in items:
        if no_class := _DRA_NO_CLASS.match(item):
            device_class = no_class.group(1)
            kinds.add("dra-class")
        elif _DRA_UNREADABLE.match(item):
            kinds.add("dra-request")
        elif _DRA_INVALID.match(item):
            kinds.add("dra-driver")
        elif _RESOURCES.match(item):
            kinds.add("resources")
        elif _STORAGE.search(item):
            kinds.add("storage")
        elif _PLACEMENT.search(item):
            kinds.add("placement")
        else:
            return None  # perhaps the GPU: a wait for one
    return kinds, device_class


def node_may_mend(message: str) -> bool:
    """The scheduler's reasons in `message` are all ones a node that is not there yet mends:
    the nodes that are there are other pools' (selectors, taints) or full (CPU, memory). An
    autoscaled pool at zero nodes reads as "didn't match Pod's node affinity/selector": only
    other pools' nodes exist."""
    read = _scheduling_kinds(message)
    return read is not None and bool(read[0]) and read[0] <= {"placement", "resources"}


def scheduling_trouble(message: str, autoscaling: NodeAutoscaling | None = None) -> str | None:
    """Why the scheduler places the pod on no node, in words, where NONE of its reasons is
    about a GPU (CPU or memory short, taints, node selectors, storage); None where any reason
    may be the GPU (`Insufficient nvidia.com/gpu`, a DRA claim, a GPU scheduler's own words)
    or the message is not the scheduler's usual one: then the pod waits for a GPU.

    `autoscaling`: the node autoscaler's latest word on the pod (`node_autoscaling`); where it
    says no node is added, its reason is added to the words when short. Where it adds one,
    `scheduling_wait` has the words: callers ask it first."""
    read = _scheduling_kinds(message)
    if read is None:
        return None
    kinds, device_class = read
    if "dra-class" in kinds:  # PreFilter's: the same for every node
        return (
            f"Your server's GPU cannot be allocated: it asks for the device class {device_class}, "
            "which this cluster does not have (its DRA driver is not installed, or the pool "
            "names another class). This does not change by itself: tell an administrator."
        )
    if "dra-request" in kinds:
        return (
            "Your server's GPU cannot be allocated: the cluster's scheduler cannot handle its "
            "request (its Kubernetes version or feature gates do not match the pool's "
            "settings). This does not change by itself: tell an administrator."
        )
    if "dra-driver" in kinds:
        return (
            "Your server's GPU cannot be allocated: the DRA driver of the pool's nodes publishes "
            "its devices in a form the scheduler refuses (invalid resource pools). This does "
            "not change by itself: tell an administrator."
        )
    said = ""
    if autoscaling is not None and not autoscaling.adding and autoscaling.detail:
        if len(autoscaling.detail) <= _SHORT_DETAIL:
            who = autoscaling.who[0].upper() + autoscaling.who[1:]
            said = f" {who} adds no node for it ({autoscaling.detail})."
    if "resources" in kinds:  # the other nodes are other pools' (their selector, taints)
        return (
            "No node for your server has the CPU or memory it asks for free right now; the "
            "GPU is not what it waits for. It starts by itself once some frees; if it does "
            f"not, tell an administrator.{said}"
        )
    if "storage" in kinds:
        return (
            "Your server's storage cannot be attached on any node that could take it. This "
            "does not change by itself: tell an administrator."
        )
    return (
        "No node takes your server: the pool's nodes do not match what the pod asks for "
        "(their labels or taints), or they are closed to new pods. This does not change by "
        f"itself: tell an administrator.{said}"
    )


# ---------------------------------------------------------------- a node being added
# A node autoscaler answers a pod the scheduler finds no node for with an event on the pod:
# - the Kubernetes cluster autoscaler (GKE's, EKS's, AKS's): "TriggeredScaleUp", "pod
#   triggered scale-up: [{<node group> 0->1 (max: 3)}]", or "NotTriggerScaleUp", "pod didn't
#   trigger scale-up: <reasons>" (kubernetes/autoscaler cluster-autoscaler/processors/status/
#   eventing_scale_up_processor.go; the group as ScaleUpInfo.String() writes it,
#   processors/nodegroupset/nodegroup_set_processor.go). It looks every scan-interval (10 s).
# - Karpenter: "Nominated", "Pod should schedule on: nodeclaim/<name>[, node/<name>]", or a
#   "FailedScheduling" of its own, "Failed to schedule pod, <why>" (kubernetes-sigs/karpenter
#   pkg/controllers/provisioning/scheduling/events.go, pkg/events/reason.go).
# Where one adds a node the pod starts by itself once it is ready: a wait, not a hopeless pod.
_SCALE_UP = re.compile(r"\{(\S+) (\d+)->(\d+) \(max: \d+\)\}")
_KARPENTER_FAILED = "Failed to schedule pod, "
#: how long an autoscaler's reason may be to be added to the words
_SHORT_DETAIL = 120


class NodeAutoscaling(NamedTuple):
    """A node autoscaler's latest word on a pod."""

    adding: bool  # a node is being added for it
    who: str  # "the cluster autoscaler", "Karpenter"
    detail: str  # the node groups scaled up, the nodeclaim, or why none is added


def _autoscaler_event(raw: Mapping[str, Any]) -> NodeAutoscaling | None:
    reason = str(raw.get("reason") or "")
    message = str(raw.get("message") or "").strip()
    if reason == "TriggeredScaleUp":
        groups = [
            f"{g.rstrip('/').rsplit('/', 1)[-1]} from {n} to {m} nodes"
            for g, n, m in _SCALE_UP.findall(message)
        ]
        return NodeAutoscaling(True, "the cluster autoscaler", ", ".join(groups))
    if reason == "NotTriggerScaleUp":
        why = message.removeprefix("pod didn't trigger scale-up:").strip()
        return NodeAutoscaling(False, "the cluster autoscaler", why)
    if reason == "Nominated" and message.startswith("Pod should schedule on:"):
        return NodeAutoscaling(True, "Karpenter", message.split(":", 1)[1].strip())
    if reason == "FailedScheduling" and message.startswith(_KARPENTER_FAILED):
        return NodeAutoscaling(False, "Karpenter", message.removeprefix(_KARPENTER_FAILED))
    return None


def is_autoscaler_event(raw: Mapping[str, Any]) -> bool:
    """`raw` is a node autoscaler's word on a pod (`node_autoscaling`)."""
    return _autoscaler_event(raw) is not None


def node_autoscaling(events: Iterable[Mapping[str, Any]]) -> NodeAutoscaling | None:
    """The latest word of a node autoscaler among a pod's `events` (oldest first, as
    `pod_events` gives them), or None where none has spoken (none runs, or not yet)."""
    latest = None
    for event in events:
        latest = _autoscaler_event(event) or latest
    return latest


def node_coming(autoscaling: NodeAutoscaling, kept: str | None = None) -> str:
    """A node autoscaler adds a node for the pod. `kept`: how long its place in line is kept
    (admission "wait"), None where it has none."""
    if autoscaling.who == "Karpenter":
        doing = f"Karpenter is starting {autoscaling.detail}" if autoscaling.detail else "Karpenter"
    elif autoscaling.detail:
        doing = f"the cluster autoscaler is scaling up {autoscaling.detail}"
    else:
        doing = "the cluster autoscaler is adding it"
    words = (
        f"A node is being added for your server ({doing}); it starts by itself once the "
        "node is ready, usually within a few minutes"
    )
    return words + (f" (your place is kept for {kept})." if kept else ".")


def scheduling_wait(
    message: str,
    autoscaling: NodeAutoscaling | None,
    *,
    early: bool,
    kept: str | None = None,
) -> str | None:
    """Words of a wait where `scheduling_trouble` would say the pod has no node for a reason a
    new node mends (selectors, taints: a pool with no node; CPU or memory short) and a node
    may be coming: a node autoscaler is adding one (`autoscaling`), or none has spoken yet
    and the pod is young (`early`: an autoscaler answers within its scan interval). None
    otherwise: the hard words stand (and where an autoscaler said it adds no node)."""
    if not node_may_mend(message):
        return None
    if autoscaling is not None:
        return node_coming(autoscaling, kept) if autoscaling.adding else None
    if not early:
        return None
    if "resources" in (_scheduling_kinds(message) or ((), ""))[0]:
        found = "No node has the CPU or memory your server asks for free right now"
    else:
        found = "None of the cluster's nodes now takes your server (their labels or taints)"
    return f"{found}; checking whether the cluster adds a node for it (up to a minute)."


def scheduler_absent(scheduler: str, waited: str) -> str:
    """A pod no scheduler has looked at: its scheduler is not running (HAMi's, Volcano's,
    KAI's scheduler not installed). Kubernetes says nothing at all about such a pod."""
    return (
        f"No scheduler has taken up your server in {waited}: the scheduler it needs "
        f"({scheduler}) may not be installed or running. This does not change by itself: tell "
        "an administrator."
    )


def gpus_unoffered(
    offer: str,
    pool: str,
    *,
    dra: bool = False,
    mig_profile: str | None = None,
    resource: str | None = None,
    waited: str | None = None,
) -> str:
    """The scheduler's "Insufficient nvidia.com/gpu" (or a DRA claim it cannot allocate) where
    the pod watch says no node of the pool offers a unit of this offer to Kubernetes at all:
    not one that is taken. `offer` '1/4 GPU', `pool` its display name; `mig_profile` where the
    pool's backend is MIG (then a layout without that profile is as likely as a plugin that is
    not running, and the nodes may offer GPUs of other profiles); `resource` the device
    plugin's resource the pods ask for where the plugin may publish it under another name
    (time-slicing, MPS: renameByDefault); `waited` how long the pod has waited, None within
    the grace a node that has just joined takes to register its GPUs (then the pod still waits
    in line)."""
    what = f"a {mig_profile} MIG instance" if mig_profile else "a GPU"
    if waited is None:
        return (
            f"Waiting for your {offer} on {pool}: none of the pool's nodes offers {what} to "
            "Kubernetes yet (a node that has just started registers its GPUs within minutes)."
        )
    if dra:
        fix = (
            "the DRA driver on the pool's nodes is not running, or publishes none of the "
            "pool's devices as ResourceSlices"
        )
    elif mig_profile:
        fix = (
            f"the GPUs' MIG layout has no {mig_profile} instance (nvidia.com/mig.config), or "
            "the device plugin is not running"
        )
    elif resource:
        fix = (
            f"none of the pool's nodes has any {resource} allocatable: the GPU device plugin "
            "there is not running or not registered with the kubelet, or it publishes another "
            "name, as with renameByDefault, which the pool's rename_by_default must match"
        )
    else:
        fix = (
            "the GPU device plugin on the pool's nodes, NVIDIA's, HAMi's or another, is not "
            "running or not registered with the kubelet"
        )
    return (
        f"None of the nodes of {pool} offers {what} to Kubernetes now, so your {offer} cannot "
        f"be reserved (your server has waited {waited}). This does not change by itself: tell "
        f"an administrator (for them: {fix})."
    )
