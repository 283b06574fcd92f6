"""The Kubeflow webhook object run in process, for tests of its reservation bookkeeping that a
caller other than kube-apiserver steers (forged reviews, tenant-set keys): its cluster reads
replaced (namespace labels), its watches fed by hand. What a user sees through the API is
tested through kube-apiserver (tests/test_dra_kubeflow.py, tests/test_kubeflow_webhook.py)."""

from __future__ import annotations

from typing import Any


class FakeWatch:
    def __init__(self, index: Any) -> None:
        self.index = index

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def wait_synced(self, timeout: float) -> None:
        assert self.index.synced


class FakeCluster:
    """The webhook's reads: namespace labels (team a, or none) and a watch that is fed by
    hand. `_api_client` is never used: nothing is started."""

    timeout = 5.0
    _api_client = None

    def __init__(self, namespaces: dict[str, dict[str, str]]) -> None:
        self.namespaces = namespaces

    async def namespace(self, name: str):
        return self.namespaces.get(name, {}), {}

    def pod_watch(self, index: Any) -> FakeWatch:
        return FakeWatch(index)


def allowed(answer: dict[str, Any]) -> bool:
    return answer["response"]["allowed"]


def message(answer: dict[str, Any]) -> str:
    return answer["response"]["status"]["message"]
