"""FracSpawner's resuming pod reflector against the real kube-apiserver (issue 37 on issue 35's
control plane): a 410 Gone (etcd compacted past the version a watch resumes from) and a restart
of kube-apiserver alone each cost one list, after which the view is what the API holds (no pod
missed or kept).

tests/test_hub_reflectors.py shows, on the same control plane, kubespawner's reflector relisting
where this one resumes; the scale benchmark measures it at 20,000 pods (benchmarks/recovery.py).
No timing is asserted: waits are hang guards.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config

from benchmarks.real_cluster import compact_etcd, restart_apiserver
from devcluster.controlplane import ControlPlane
from fracspawner.hub.reflectors import ResumingEventReflector, ResumingPodReflector
from tests.test_controlplane import _binary
from tests.test_hub_reflectors import Counting, _api_pods, _pod, _until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
LABELS = {"component": "singleuser-server"}


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    _binary()
    with ControlPlane.start(tmp_path_factory.mktemp("controlplane")) as running:
        yield running


@pytest.fixture
async def core(cp: ControlPlane) -> AsyncIterator[client.CoreV1Api]:
    saved = client.Configuration.get_default_copy()
    await config.load_kube_config(config_file=str(cp.kubeconfig))
    api = client.ApiClient()
    try:
        yield client.CoreV1Api(api)
        for name in await _api_pods(client.CoreV1Api(api)):  # a clean namespace for the next
            await client.CoreV1Api(api).delete_namespaced_pod(
                name.split("/")[1], "default", grace_period_seconds=0
            )
    finally:
        await api.close()
        client.Configuration.set_default(saved)


def _reflector(cls: type = ResumingPodReflector) -> Any:
    reflector = cls(
        namespace="default", labels=LABELS, timeout_seconds=1, initial_backoff=0.1, max_backoff=0.5
    )
    reflector.api = Counting(reflector.api)
    return reflector


def _about(events: ResumingEventReflector, pod: str) -> bool:
    return any(e["involvedObject"]["name"] == pod for e in events.resources.values())


async def _api_events(core: client.CoreV1Api) -> set[str]:
    listing = await core.list_namespaced_event("default", field_selector="involvedObject.kind=Pod")
    return {f"default/{e.metadata.name}" for e in listing.items}


async def test_a_410_from_etcd_costs_one_list(cp, core, caplog):
    # pods watched from etcd itself (no watch cache for them): a watch from a version etcd has
    # compacted away is answered 410 Gone ("The resourceVersion for the provided watch is too
    # old."). With its watch cache, kube-apiserver 1.36 answered a watch from version 1 with no
    # event and no error, so the 410 is forced where the API server reads etcd.
    caplog.set_level(logging.DEBUG, logger="traitlets")  # every failed watch, not the first
    restart_apiserver(cp, ["--watch-cache-sizes=pods#0"])
    await core.create_namespaced_pod("default", _pod("a"))
    ours = _reflector()
    try:
        await ours.start()
        await _until(lambda: ours.api.watches >= 1, "a first watch")
        compact_etcd(cp)
        ours.api.rewind = "1"  # the next watch resumes from a compacted version
        await _until(lambda: ours.lists >= 2, "a list after the 410")
        await core.create_namespaced_pod("default", _pod("b"))
        await core.delete_namespaced_pod("a", "default", grace_period_seconds=0)
        await _until(lambda: set(ours.pods) == {"default/b"}, "the view after the 410")
        watches = ours.api.watches
        await _until(lambda: ours.api.watches >= watches + 2, "watching on")
        assert set(ours.pods) == await _api_pods(core) == {"default/b"}
        # one list per 410, then resumed. A watch the API server broke otherwise is listed
        # again too, as client-go's reflector does (tools/cache/reflector.go: an internal error
        # is watched again without a list only where MaxInternalErrorRetryDuration is set, the
        # API server's own cacher; a list is what repairs an event lost that way): without its
        # watch cache, kube-apiserver answered a fresh clone's run with 500 "etcd event
        # received with PrevKv=nil" for pod a, whose earlier version the compaction had
        # removed (lists were 3)
        # More than one 410 is possible: etcd's revision is global (the scheduler's and the
        # controller manager's leases move it every few seconds), so a watch resumed on its own
        # from the version before the compaction may be answered 410 too, before the rewound
        # one is sent (a fresh clone's CI run: two 410s, three lists). Each still costs one list.
        messages = [r.getMessage() for r in caplog.records]
        expired = sum("watch: Expired" in m and "listing again" in m for m in messages)
        broken = sum("Cannot watch" in m for m in messages)
        assert expired >= 1, messages
        assert 1 + expired <= ours.lists <= 1 + expired + broken, (ours.lists, expired, broken)
    finally:
        await ours.stop()
        restart_apiserver(cp)  # with its watch cache again


async def test_after_kube_apiserver_restarts_the_view_is_whole_after_one_list(
    cp, core, tmp_path: Path
):
    for name in ("a", "b"):
        await core.create_namespaced_pod("default", _pod(name))
    ours = _reflector()
    # the pods' events as a hub watches them (kubespawner: involvedObject.kind=Pod); with no
    # node, kube-scheduler writes a FailedScheduling event for each pod
    events = ResumingEventReflector(
        namespace="default", fields={"involvedObject.kind": "Pod"}, timeout_seconds=1,
        initial_backoff=0.1, max_backoff=0.5,
    )  # fmt: skip
    events.api = Counting(events.api)
    try:
        await ours.start()
        await events.start()
        assert set(ours.pods) == {"default/a", "default/b"}
        restart_apiserver(cp)  # etcd, the scheduler and the controller manager stay up
        await core.create_namespaced_pod("default", _pod("c"))
        await core.delete_namespaced_pod("a", "default", grace_period_seconds=0)
        want = await _api_pods(core)
        assert want == {"default/b", "default/c"}
        await _until(lambda: set(ours.pods) == want, "the view after the restart")
        uids = {p.metadata.name: p.metadata.uid for p in (await core.list_namespaced_pod(
            "default", label_selector="component=singleuser-server")).items}  # fmt: skip
        assert {k.split("/")[1]: v["metadata"]["uid"] for k, v in ours.pods.items()} == uids
        watches = ours.api.watches
        await _until(lambda: ours.api.watches >= watches + 2, "watching on")
        assert set(ours.pods) == want  # nothing of before the restart came back
        assert ours.lists == 2  # start's, and one after the restart
        # the event reflector too: it resumes where it can (etcd kept the version it saw) or
        # lists once, and sees what happened after the restart
        await _until(lambda: _about(events, "c"), "an event about the pod made after the restart")
        deadline = asyncio.get_running_loop().time() + 60
        while set(events.resources) != (api_events := await _api_events(core)):
            assert asyncio.get_running_loop().time() < deadline, (events.resources, api_events)
            await asyncio.sleep(0.2)
        assert events.lists <= 2
    finally:
        await ours.stop()
        await events.stop()
