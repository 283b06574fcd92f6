"""What a node-agent test prints when a pod does not get where it waited for it: the pod's
phase, conditions and each container's state, its events (`kubectl get events
--field-selector involvedObject.name=...`), each container's log tail, and what the in-process
node agent knows of it (NodeAgent.describe: its pod worker's own view, its last warnings).
`with explained(cp, ns, name, agent): eventually(...)`."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from devcluster.controlplane import ControlPlane
from devcluster.nodeagent import NodeAgent
from tests.test_controlplane import kubectl


def _state(entry: dict[str, Any]) -> str:
    kind, detail = next(iter((entry.get("state") or {}).items()), ("unknown", {}))
    said = ", ".join(f"{k}={detail[k]}" for k in ("reason", "exitCode", "message") if k in detail)
    return (
        f"{entry['name']}: {kind}{f' ({said})' if said else ''} ready={entry.get('ready')} "
        f"started={entry.get('started')} restarts={entry.get('restartCount', 0)}"
    )


def _json(cp: ControlPlane, *args: str) -> dict[str, Any] | str:
    try:
        done = kubectl(cp, "get", *args, "-o", "json", check=False)
    except subprocess.TimeoutExpired:
        return "(kubectl timed out)"
    if done.returncode != 0:
        return f"(kubectl get {' '.join(args)}: {done.stderr.strip()})"
    return json.loads(done.stdout)


def pod_report(
    cp: ControlPlane, namespace: str, name: str, agent: NodeAgent | None = None, lines: int = 20
) -> str:
    """The pod as the apiserver has it, its events, its containers' logs, the agent's view."""
    out = [f"--- pod {namespace}/{name}:"]
    pod = _json(cp, "pod", name, "-n", namespace)
    containers: list[str] = []
    if isinstance(pod, str):
        out.append(pod)
    else:
        status = pod.get("status") or {}
        spec = pod.get("spec") or {}
        containers = [c["name"] for c in [*(spec.get("initContainers") or []),
                                          *(spec.get("containers") or [])]]  # fmt: skip
        out.append(f"phase {status.get('phase')} on {spec.get('nodeName')}")
        for c in status.get("conditions") or []:
            why = " ".join(c.get(k, "") for k in ("reason", "message") if c.get(k))
            out.append(f"  condition {c['type']}={c['status']}{f' ({why})' if why else ''}")
        for key in ("initContainerStatuses", "containerStatuses"):
            out += [f"  {key[:-8]} {_state(e)}" for e in status.get(key) or []]
    events = _json(cp, "events", "-n", namespace, f"--field-selector=involvedObject.name={name}")
    out.append("--- its events:")
    if isinstance(events, str):
        out.append(events)
    else:
        when = lambda e: e.get("lastTimestamp") or e.get("eventTime") or ""  # noqa: E731
        for e in sorted(events["items"], key=when):
            where = (e.get("involvedObject") or {}).get("fieldPath", "")
            out.append(f"  {when(e)} {e.get('type')} {e.get('reason')} {where}: "
                       f"{e.get('message')}")  # fmt: skip
    for container in containers:
        try:
            log = kubectl(cp, "logs", name, "-n", namespace, "-c", container, f"--tail={lines}",
                          check=False)  # fmt: skip
            said = log.stdout or log.stderr
        except subprocess.TimeoutExpired:
            said = "(kubectl logs timed out)"
        out.append(f"--- {container}'s log:\n{said.rstrip()}")
    if agent is not None:
        out.append(f"--- the node agent:\n{agent.describe(namespace, name)}")
    return "\n".join(out)


@contextmanager
def explained(
    cp: ControlPlane, namespace: str, name: str, agent: NodeAgent | None = None
) -> Iterator[None]:
    """An AssertionError raised inside (a wait that ran out) goes on with `pod_report`."""
    try:
        yield
    except AssertionError as err:
        raise AssertionError(f"{err}\n{pod_report(cp, namespace, name, agent)}") from None
