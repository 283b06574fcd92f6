"""The node agent's pod worker (devcluster/nodeagent/podworker.py) against a stand-in for its
node's API calls, with real container processes (containers.ContainerRunner): what the
apiserver keeps of the pod's status must be the worker's latest, whatever the order in which
concurrent status writes arrive and whether one of them fails. The kubelet's status manager
writes one status at a time, the latest, and retries a failed write
(pkg/kubelet/status/status_manager.go syncPod/syncBatch)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devcluster.nodeagent.containers import ContainerRunner
from devcluster.nodeagent.podworker import PodWorker

Status = dict[str, Any]


class FakeNode:
    """podworker.NodeApi: the stored status is the last write that arrived. `late(status)`:
    seconds the write waits before it arrives (in its own thread, as a slow request);
    `fails(status)`: it raises OSError instead (a timeout, a reset connection)."""

    def __init__(
        self,
        late: Callable[[Status], float] = lambda _s: 0.0,
        fails: Callable[[Status], bool] = lambda _s: False,
        env_fails: Callable[[str], bool] = lambda _c: False,
    ) -> None:
        self.late, self.fails, self.env_fails = late, fails, env_fails
        self.stored: Status | None = None
        self.in_flight = 0
        self._lock = threading.Lock()

    def patch_status(self, pod: Any, status: Status) -> bool:
        with self._lock:
            self.in_flight += 1
        try:
            time.sleep(self.late(status))
            if self.fails(status):
                raise OSError("the status write timed out")
            with self._lock:
                self.stored = status
            return True
        finally:
            with self._lock:
                self.in_flight -= 1

    def event(self, *args: Any, **kwargs: Any) -> None:
        pass

    def remove(self, pod: Any) -> None:
        pass

    def lookup(self, plural: str, namespace: str, name: str) -> None:
        return None

    def service_env(self, pod: Any) -> dict[str, str]:
        return {}

    def claim_env(self, pod: Any, container: str) -> dict[str, str]:
        if self.env_fails(container):
            raise OSError(f"reading {container}'s claims: connection reset")
        return {}


def sh(name: str, script: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "image": "python", "command": ["sh", "-c", script], **more}


#: the shape of tests/test_nodeagent_kubeletapi's "multi": an init container, a sidecar, two apps
MULTI = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "multi", "namespace": "podworker", "uid": "uid-multi"},
    "spec": {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "initContainers": [
            sh("init", "echo init ran"),
            sh("sidecar", "exec sleep 600", restartPolicy="Always"),
        ],
        "containers": [sh("main", "exec sleep 600"), sh("second", "exec sleep 600")],
    },
}


def states(status: Status | None, key: str = "containerStatuses") -> dict[str, str]:
    return {c["name"]: next(iter(c["state"])) for c in (status or {}).get(key) or []}


async def settled(worker: PodWorker, node: FakeNode, timeout: float = 60.0) -> Status | None:
    """The stored status once every app container runs and no write is on its way or to be
    tried again; after `timeout` the stored status as it is (the caller's assertion then says
    what it shows)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = all("running" in b.entry["state"] for b in worker.apps)
        if running and node.in_flight == 0 and not worker.writer.failing:
            await asyncio.sleep(0.5)  # a write the worker is about to make
            if node.in_flight == 0:
                break
        await asyncio.sleep(0.1)
    return node.stored


async def run_multi(tmp_path: Path, node: FakeNode) -> tuple[PodWorker, Status | None]:
    runner = ContainerRunner(tmp_path)
    worker = PodWorker(MULTI, node, runner, backoff=(0.2, 1.0))
    worker.task = asyncio.create_task(worker.main())
    try:
        return worker, await settled(worker, node)
    finally:
        worker.deleting.set()
        await asyncio.wait_for(worker.task, 60)
        runner.kill_all()


def _shows(status: Status | None) -> str:
    return (
        f"phase {(status or {}).get('phase')}, apps {states(status)}, "
        f"inits {states(status, 'initContainerStatuses')}"
    )


async def test_the_latest_status_is_stored_when_an_earlier_write_arrives_late(tmp_path: Path):
    # main's start is written while second still waits; that write arrives after second's
    # (both running): the apiserver must not be left with the older one
    def late(status: Status) -> float:
        return 1.0 if states(status) == {"main": "running", "second": "waiting"} else 0.0

    worker, stored = await run_multi(tmp_path, FakeNode(late=late))
    assert stored is not None
    assert (stored["phase"], states(stored)) == (
        "Running",
        {"main": "running", "second": "running"},
    ), _shows(stored)


async def test_a_failed_status_write_is_retried_and_the_pod_goes_on(tmp_path: Path):
    # the write saying the sidecar started fails once: the app containers start all the same
    # (the sidecar did start); the write saying both app containers run fails once too, and
    # nothing changes after it: only trying it again gets it through
    failed: dict[str, Status] = {}

    def fails(status: Status) -> bool:
        started = [c for c in status.get("initContainerStatuses") or [] if c.get("started")]
        both = states(status) == {"main": "running", "second": "running"}
        which = "both" if both else "sidecar" if started else ""
        if which and which not in failed:
            failed[which] = status
            return True
        return False

    worker, stored = await run_multi(tmp_path, FakeNode(fails=fails))
    assert set(failed) == {"sidecar", "both"}, "a write meant to fail was never made"
    assert stored is not None
    assert (stored["phase"], states(stored)) == (
        "Running",
        {"main": "running", "second": "running"},
    ), _shows(stored)


async def test_an_api_read_that_fails_while_a_container_is_made_is_tried_again(tmp_path: Path):
    # a connection error reading what second's env needs: second is made on the next try
    tries: list[str] = []

    def env_fails(container: str) -> bool:
        tries.append(container)
        return container == "second" and tries.count("second") == 1

    worker, stored = await run_multi(tmp_path, FakeNode(env_fails=env_fails))
    assert tries.count("second") >= 2
    assert stored is not None
    assert (stored["phase"], states(stored)) == (
        "Running",
        {"main": "running", "second": "running"},
    ), _shows(stored)
