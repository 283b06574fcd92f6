"""What the spawn-form benchmarks (bench_form, bench_scale) share: a stand-in hub user and a
count of the Kubernetes API requests the spawners make."""

from __future__ import annotations


class HubUser:
    """The minimum of jupyterhub.user.User that a spawner rendering its form needs."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.id = 1
        self.url = f"/user/{name}/"
        self.groups: list[str] = []
        self.admin = False
        self.escaped_name = name


def count_requests() -> dict[str, int]:
    """Count every HTTP request kubernetes_asyncio sends from now on (the only way the spawners
    reach Kubernetes) in the returned dict's "n"; for the rest of the process."""
    from kubernetes_asyncio.client import rest

    counter = {"n": 0}
    original = rest.RESTClientObject.request

    async def counting(self, *args, **kwargs):
        counter["n"] += 1
        return await original(self, *args, **kwargs)

    rest.RESTClientObject.request = counting
    return counter
