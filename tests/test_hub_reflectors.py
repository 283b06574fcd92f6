"""The hub's pod and event reflectors resume their watch instead of re-listing (issue 37).

kubespawner's reflector lists every watched pod again each time the API server ends a watch
(`timeout_seconds`): at 20,000 pods most of a big hub's idle CPU. FracSpawner's reflectors list
once, follow watches from the last resourceVersion, and list again only after a 410 or a broken
stream; what kubespawner reads (`pods`, `events`) stays whole through both.

Run against the real kube-apiserver (issue 35; no node: the pods stay Pending, as listed) on a
test's time scale (watches end after 1 s); the assertions count requests and compare views,
never time anything. A 410 Gone (etcd compacted) and a restart of kube-apiserver, each costing
one list, are tests/test_hub_reflectors_real.py's, which imports this module's helpers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client, config
from kubespawner.spawner import PodReflector

from devcluster.controlplane import ControlPlane
from fracspawner.hub.reflectors import ResumingEventReflector, ResumingPodReflector
from fracspawner.hub.spawner import FracSpawner

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LABELS = {"component": "singleuser-server"}


async def _until(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Wait for something the reflector reaches in the background (a hang guard only)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.05)


class Counting:
    """The reflector's API object, counting list and watch requests as they are sent."""

    def __init__(self, api: Any) -> None:
        self.api, self.lists, self.watches = api, 0, 0
        self.rewind: str | None = None  # the next watch resumes from this version instead

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.api, name)
        if not name.startswith("list_"):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("watch"):
                self.watches += 1
                if self.rewind is not None:
                    kwargs["resource_version"], self.rewind = self.rewind, None
            else:
                self.lists += 1
            return method(*args, **kwargs)

        call.__doc__ = method.__doc__  # kubernetes_asyncio's Watch reads the return type there
        return call


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """kube-apiserver, etcd, the scheduler and the controller manager; no node."""
    from tests.test_controlplane import _binary

    _binary()
    with ControlPlane.start(tmp_path_factory.mktemp("controlplane")) as running:
        yield running


@pytest.fixture
async def cluster(cp: ControlPlane) -> AsyncIterator[ControlPlane]:
    """The default kubernetes_asyncio configuration at the admin's kubeconfig; the test's pods
    deleted afterwards (a clean namespace for the next)."""
    saved = client.Configuration.get_default_copy()
    await config.load_kube_config(config_file=str(cp.kubeconfig))
    try:
        yield cp
        async with client.ApiClient() as api:
            core = client.CoreV1Api(api)
            for name in await _api_pods(core):
                await core.delete_namespaced_pod(
                    name.split("/")[1], "default", grace_period_seconds=0
                )
    finally:
        client.Configuration.set_default(saved)


def _pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": dict(LABELS)},
        "spec": {"containers": [{"name": "notebook", "image": "x", "command": ["sleep", "1"]}]},
    }


async def _api_pods(core: client.CoreV1Api) -> set[str]:
    listing = await core.list_namespaced_pod(
        "default", label_selector="component=singleuser-server"
    )
    return {f"default/{p.metadata.name}" for p in listing.items}


def _reflector(cls: type, **kwargs: Any) -> Any:
    reflector = cls(namespace="default", labels=LABELS, timeout_seconds=1, **kwargs)
    reflector.api = Counting(reflector.api)
    return reflector


async def test_the_pod_reflector_lists_once_and_resumes_where_kubespawners_relists(cluster):
    core = client.CoreV1Api()
    for name in ("a", "b"):
        await core.create_namespaced_pod("default", _pod(name))
    theirs = _reflector(PodReflector)
    ours = _reflector(ResumingPodReflector, initial_backoff=0.1)
    try:
        await theirs.start()
        await ours.start()
        # pods come and go while both follow
        await core.create_namespaced_pod("default", _pod("c"))
        await core.delete_namespaced_pod("a", "default", grace_period_seconds=0)
        await _until(lambda: theirs.api.watches >= 4 and ours.api.watches >= 4, "4 watches each")
        # kubespawner's: one list per watch (the cost this replaces)
        assert theirs.api.lists >= 4
        # ours: the start's list and no other
        assert ours.api.lists == 1, f"{ours.api.lists} lists for {ours.api.watches} watches"
        want = await _api_pods(core)
        await _until(lambda: set(ours.pods) == want, "the view holds what the API holds")
        assert want == {"default/b", "default/c"}
        # what the hub keeps of a pod is what kubespawner and FracSpawner read of it
        kept = ours.pods["default/b"]
        assert set(kept["spec"]) <= {"containers", "nodeName", "schedulerName"}
        assert kept["spec"]["containers"] == [{"name": "notebook", "ports": []}]
        # conditions: the PodScheduled one alone, while the pod waits for a node
        assert set(kept["status"]) <= {"phase", "podIP", "containerStatuses", "conditions"}
        for condition in kept["status"].get("conditions", []):
            assert condition["type"] == "PodScheduled" and condition["status"] != "True"
        assert kept["status"]["phase"] == "Pending" and kept["metadata"]["uid"]
        assert kept["metadata"]["creationTimestamp"]  # the pending page's "waiting for ..."
        assert "managedFields" not in kept["metadata"]
    finally:
        await theirs.stop()
        await ours.stop()


async def test_a_fracspawner_hub_watches_with_the_resuming_reflectors(cluster):
    """The reflectors a FracSpawner starts for the hub (KubeSpawner's shared `reflectors`,
    the ones `pod_reflector` / `event_reflector` read) are these, and hold the cluster's pods."""
    from traitlets.config import Config

    from fracspawner.cli.plan import _Hub, _User, use_kubeconfig
    from tests.conftest import DEMO_CATALOG

    core = client.CoreV1Api()
    await core.create_namespaced_pod("default", _pod("jupyter-lee"))
    cfg = Config()
    cfg.FracSpawner.catalog_file = str(DEMO_CATALOG)
    cfg.FracSpawner.live_capacity = False
    cfg.FracSpawner.namespace = "default"
    with use_kubeconfig(cluster.kubeconfig):
        spawner = FracSpawner(config=cfg, user=_User("lee", [], False), hub=_Hub())
    try:
        await spawner._start_watching_pods()
        await spawner._start_watching_events()
        assert type(spawner.pod_reflector) is ResumingPodReflector
        assert type(spawner.event_reflector) is ResumingEventReflector
        assert "default/jupyter-lee" in spawner.pod_reflector.pods
    finally:
        await FracSpawner._stop_all_reflectors()
