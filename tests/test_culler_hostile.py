"""Hostile input at the culler's report endpoint (issue 20): any pod can reach it, and a
server's own token makes it a sender. Everything here goes through the real receiver (the
Culler's own HTTP server, TokenVerifier, ReportStore, metrics) on a loopback port; the hub is a
stand-in for two of JupyterHub's REST calls (jupyterhub/jupyterhub,
jupyterhub/apihandlers/users.py): `GET /hub/api/user` as SelfAPIHandler answers (403 for a token
it does not know, else the owner's model with `kind` and the token's `scopes`), and
`GET /hub/api/users?state=ready` as UserListAPIHandler answers the culler (the users with ready
servers; with `Accept: application/jupyterhub-pagination+json`, JupyterHub >= 2.0, an object
with `items` and `_pagination` {offset, limit, total, next}: apihandlers/base.py
`paginated_model`); each server model with `started`, `last_activity`, `ready`, `url` and the
`user_options` the spawner stored. `DELETE .../server` answers 204 as a stopped server does."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import urlparse

import pytest
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.httpserver import HTTPServer

from devcluster.localhub import free_port
from fracspawner.culler import Culler

T0 = "2026-01-01T00:00:00+00:00"
ANN = {  # a server's token: the hub's `server` role (access:servers!server=ann/gpu)
    "kind": "user",
    "name": "ann",
    "scopes": ["access:servers!server=ann/gpu", "users:activity!user=ann"],
}


@dataclass
class Hub:
    tokens: dict[str, dict] = field(default_factory=dict)
    asked: int = 0
    # user -> server name -> the server model's fields (user_options, started, last_activity)
    servers: dict[str, dict[str, dict]] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)

    def users_page(self) -> dict:
        items = [
            {"kind": "user", "name": user, "groups": [], "servers": {
                name: {"name": name, "ready": True, "pending": None,
                       "url": f"/user/{user}/{name}/", **model}
                for name, model in servers.items()
            }}
            for user, servers in sorted(self.servers.items()) if servers
        ]  # fmt: skip
        info = {"offset": 0, "limit": 200, "total": len(items), "next": None}
        return {"items": items, "_pagination": info}


@dataclass
class Receiver:
    culler: Culler
    hub: Hub
    url: str

    async def post(self, body: object, token: str | None = "ann-token") -> tuple[int, dict, dict]:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"token {token}"
        client = AsyncHTTPClient()
        resp = await client.fetch(
            HTTPRequest(self.url, method="POST", body=raw, headers=headers), raise_error=False
        )
        answer = json.loads(resp.body) if resp.body else {}
        return resp.code, answer, dict(resp.headers)

    async def flood(self, n: int, source: str, parallel: int = 50) -> list[tuple[int, bytes]]:
        """n reports with random tokens from the address `source` (another pod: loopback
        addresses other than 127.0.0.1); (status, raw answer) each, 0 for a connection the
        culler closed without answering."""
        where = urlparse(self.url)
        body = json.dumps(report()).encode()
        gate = asyncio.Semaphore(parallel)

        async def one() -> tuple[int, bytes]:
            head = (
                f"POST {where.path} HTTP/1.1\r\nHost: {where.netloc}\r\n"
                f"Authorization: token {secrets.token_hex(16)}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode()
            async with gate:
                try:
                    reader, writer = await asyncio.open_connection(
                        where.hostname, where.port, local_addr=(source, 0)
                    )
                    writer.write(head + body)
                    answer = await reader.read()
                    writer.close()
                except OSError:
                    answer = b""
            code = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
            return code, answer

        return await asyncio.gather(*(one() for _ in range(n)))

    def sample(self, name: str, **labels: str) -> float:
        value = self.culler.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def kernels_held(self) -> int:
        return sum(len(e.counted) for e in self.culler.reports._entries.values())


@pytest.fixture
async def receiver(request) -> AsyncIterator[Receiver]:
    hub = Hub({"ann-token": ANN})

    class WhoAmI(web.RequestHandler):
        def get(self) -> None:
            hub.asked += 1
            token = self.request.headers.get("Authorization", "").partition(" ")[2]
            if token not in hub.tokens:
                raise web.HTTPError(403)
            self.write(json.dumps(hub.tokens[token]))

    class Users(web.RequestHandler):
        def get(self) -> None:
            self.write(json.dumps(hub.users_page()))

    class Server(web.RequestHandler):
        def delete(self, user: str, name: str = "") -> None:
            hub.servers.get(user, {}).pop(name, None)
            hub.stopped.append(f"{user}/{name}")
            self.set_status(204)

    hub_port, port = free_port(), free_port()
    hub_server = HTTPServer(
        web.Application(
            [
                (r"/hub/api/user", WhoAmI),
                (r"/hub/api/users", Users),
                (r"/hub/api/users/([^/]+)/server", Server),
                (r"/hub/api/users/([^/]+)/servers/([^/]+)", Server),
            ]
        )
    )
    hub_server.listen(hub_port, "127.0.0.1")
    settings = dict(getattr(request, "param", {}))  # Culler settings a test asks for
    if settings.get("catalog") == "demo":
        from tests.conftest import DEMO_CATALOG

        settings["catalog"] = str(DEMO_CATALOG)
    culler = Culler(
        api_token="x",
        url=f"http://127.0.0.1:{hub_port}/hub/api",
        report_url=f"http://127.0.0.1:{port}",
        report_prefix="/",
        **settings,
    )
    culler.initialize([])
    server = culler.start_receiver()
    try:
        yield Receiver(culler, hub, f"http://127.0.0.1:{port}/api/reports")
    finally:
        server.stop()
        hub_server.stop()
        if culler._verifier is not None:
            culler._verifier.close()


async def listed(receiver: Receiver, user: str = "ann", server: str = "gpu") -> None:
    """The hub lists the server (a culler cycle): what its reports tell is counted from then."""
    now = datetime.now(timezone.utc).isoformat()  # in use: the cycle keeps it
    model = {"user_options": {}, "started": now, "last_activity": now}
    receiver.hub.servers.setdefault(user, {})[server] = model
    await receiver.culler.cull_once()


def report(**kw: object) -> dict:
    body = {
        "server_name": "gpu",
        "available": False,
        "reason": "no GPU reading yet",
        "monitor_started": T0,
        "server_last_activity": T0,
        "culled_kernels": [],
    }
    return {**body, **kw}


def kernels(n: int, start: int = 0, at: str = "") -> list[dict]:
    return [
        {"id": f"k{start + i:06d}", "at": at or None, "gpu_memory_mib": 100.0} for i in range(n)
    ]


# --- item 1: one server's report state is bounded; a kernel cull counts once -------------------
# (reports faster than the extension sends them: this one server may send 50 at once)
@pytest.mark.parametrize("receiver", [{"report_burst": 100}], indirect=True)
async def test_one_servers_report_state_is_bounded(receiver):
    # one server's own token adding new ids under one monitor_started, report after report
    for r in range(50):
        code, _, _ = await receiver.post(report(culled_kernels=kernels(64, start=64 * r)))
        assert code == 204
    assert receiver.kernels_held() <= 512  # was 3,200 (and 500k after 50 large reports)
    # more ids in one report than the extension ever sends (its last 50): refused, with why
    code, answer, _ = await receiver.post(report(culled_kernels=kernels(1000)))
    assert code == 400 and "culled_kernels: at most 64 items" in answer["message"]
    assert receiver.kernels_held() <= 512


async def test_a_kernel_cull_counts_once_across_restarts_and_old_ones_not_at_all(receiver):
    culls = ("fracspawner_culls_total", {"reason": "kernel_gpu_idle", "pool": ""})
    await listed(receiver)
    told = kernels(3)
    assert (await receiver.post(report(culled_kernels=told)))[0] == 204
    assert receiver.sample(culls[0], **culls[1]) == 3
    # the same kernels told again, by "another incarnation" (a new monitor_started)
    again = report(culled_kernels=told, monitor_started="2026-01-01T00:00:01+00:00")
    assert (await receiver.post(again))[0] == 204
    assert receiver.sample(culls[0], **culls[1]) == 3
    # a cull dated years ago is not counted (nor kept)
    old = report(culled_kernels=kernels(5, start=100, at="2020-01-01T00:00:00+00:00"))
    assert (await receiver.post(old))[0] == 204
    assert receiver.sample(culls[0], **culls[1]) == 3


# --- issue 28 item 11: one user's flood of reports cannot fill the history or forge metrics -----
TIB = 16 * 1024 * 1024  # MiB: the most a report's number may say


@pytest.mark.parametrize("receiver", [{"catalog": "demo"}], indirect=True)
async def test_a_flood_of_reports_cannot_fill_the_history_or_forge_metrics(receiver):
    """160 reports in a burst from ann's server, each telling of 64 "culled" kernels of 16 TiB
    on a pool ann may not use (a100-mig) and 16 TiB hibernated: most are refused (429 with
    Retry-After), at most report_events_per_hour of hers are counted, each at most her slice's
    memory (a quarter H100, from the hub's record of the server), under the pool the hub
    records (h100); the real stop of bob's server stays in the history."""
    hub, culler = receiver.hub, receiver.culler
    iso = lambda t: datetime.fromtimestamp(t, timezone.utc).isoformat()  # noqa: E731
    now = time.time()  # bob's server idle for 25 h, ann's in use
    hub.servers["bob"] = {
        "": {
            "user_options": {"gpu": "1/4", "pool": "h100"},
            "started": iso(now - 90000),
            "last_activity": iso(now - 90000),
        }
    }
    hub.servers["ann"] = {"gpu": {"user_options": {"gpu": "1/4", "pool": "h100"},
                                  "started": iso(now), "last_activity": iso(now)}}  # fmt: skip
    await culler.cull_once()
    assert hub.stopped == ["bob/"]  # a real stop, in the history
    forged = report(
        culled_kernels=[{"id": f"k{i}", "gpu_memory_mib": TIB} for i in range(64)],
        slice={"pool": "a100-mig"},
        hibernated_gpu_memory_mib=TIB,
    )

    def nth(r: int) -> dict:  # new kernel ids in every report
        return {**forged, "culled_kernels": [{**k, "id": f"r{r}{k['id']}"} for k in forged[
            "culled_kernels"]]}  # fmt: skip

    answers = await asyncio.gather(*(receiver.post(nth(r)) for r in range(160)))
    codes = [code for code, _, _ in answers]
    assert codes.count(204) <= 5 and codes.count(429) >= 155, codes
    refused = next(a for a in answers if a[0] == 429)
    assert int(refused[2]["Retry-After"]) >= 1 and "a minute" in refused[1]["message"]
    await culler.cull_once()
    state = culler.state_json(time.time())
    theirs = [e for e in state["history"] if e["user"] == "ann"]
    assert 0 < len(theirs) <= culler.report_events_per_hour
    slice_mib = 20389  # a quarter of an H100's 81559 MiB (NVML's total; model/gpumodels.py)
    assert {e["gpu_memory_mib"] for e in theirs} == {slice_mib}
    assert all(e["pool"] == "h100" for e in theirs)
    assert [e["user"] for e in state["history"] if e["kind"] == "server"] == ["bob"]
    assert state["summary"]["gpu_memory_mib"] <= culler.report_events_per_hour * slice_mib
    # the metrics: nothing for the pool the reports named; h100 within the same bounds
    assert receiver.sample("fracspawner_reclaimed_gpu_memory_mib_total", pool="a100-mig") == 0
    assert receiver.sample("fracspawner_hibernated_bytes", pool="a100-mig") == 0
    assert receiver.sample("fracspawner_hibernated_bytes", pool="h100") == slice_mib * 2**20
    reclaimed = receiver.sample("fracspawner_reclaimed_gpu_memory_mib_total", pool="h100")
    assert reclaimed <= culler.report_events_per_hour * slice_mib


async def test_what_a_server_tells_before_the_hub_lists_it_counts_once_it_is_listed(receiver):
    """A server started since the last cycle: its report is kept (its activity counts), the
    kernels it shut down are counted when a cycle finds it in the hub's list, not before, and
    never for a server the hub does not list."""
    culls = ("fracspawner_culls_total", {"reason": "kernel_gpu_idle", "pool": ""})
    assert (await receiver.post(report(culled_kernels=kernels(2))))[0] == 204
    assert receiver.sample(*culls[:1], **culls[1]) == 0  # not listed yet: not counted
    await receiver.culler.cull_once()  # the hub lists no server of ann's
    assert receiver.sample(*culls[:1], **culls[1]) == 0
    await listed(receiver)  # now it does
    assert receiver.sample(*culls[:1], **culls[1]) == 2
    history = receiver.culler.state_json(time.time())["history"]
    assert [e["user"] for e in history if e["kind"] == "kernel"] == ["ann"] * 2


def test_one_users_kernel_events_take_at_most_their_share_of_the_history():
    """The history keeps server stops apart from what servers report, and one user's kernel
    events at most USER_SHARE of it: their oldest make room, nobody else's."""
    from fracspawner.culler.state import CullerState, CullEvent

    state = CullerState(0.0, limit=100, user_share=0.1)
    now = time.time()

    def event(user: str, kind: str, i: int) -> CullEvent:
        return CullEvent(now - 1000 + i, user, "", "h100", "1/4", kind, "r", f"{i}", 1.0, 0.0)

    state.record(event("bob", "server", 0))
    state.record(event("carol", "kernel", 1))
    for i in range(500):
        state.record(event("mallory", "kernel", 2 + i))
    history = state.to_json(now)["history"]
    by_user = [e["user"] for e in history]
    assert by_user.count("mallory") == 10 and "bob" in by_user and "carol" in by_user
    assert [e["message"] for e in history if e["user"] == "mallory"][-1] == "501"  # the newest


# --- issue 28 item 12: refused before the body is read; the reporter honours Retry-After ------
async def head_only(url: str, headers: str, length: int = 400_000) -> bytes:
    """Send a report's headers (announcing `length` bytes of body) and no body: the status
    line of the answer, which a server that reads the body first never sends."""
    where = urlparse(url)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    writer.write(
        f"POST {where.path} HTTP/1.1\r\nHost: {where.netloc}\r\n{headers}"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n".encode()
    )
    try:  # the bound only ends a failing test (the old culler waits for the body forever)
        return await asyncio.wait_for(reader.readline(), 60)
    except asyncio.TimeoutError:
        return b"(no answer while the body was unsent)"
    finally:
        writer.close()


async def test_a_report_without_a_valid_token_is_refused_before_its_body_is_read(receiver):
    assert b" 401 " in await head_only(receiver.url, "")
    assert b" 403 " in await head_only(receiver.url, "Authorization: token not-a-token\r\n")
    # a known token's report is read and taken as before
    assert (await receiver.post(report()))[0] == 204


@pytest.mark.parametrize("receiver", [{"report_rate": 0.5, "report_burst": 1}], indirect=True)
async def test_the_reporter_waits_as_long_as_a_429_says(receiver):
    """The extension's reporter against the real receiver: a server over its rate (here one
    report, then one every 2 minutes) gets 429 with Retry-After, and the reporter's next
    report waits that long, not its usual minute."""
    from fracspawner.serverext.reporter import GpuReporter

    reporter = GpuReporter(
        report=lambda: report(), token="ann-token", server_name="gpu",
        culler_url=receiver.url.removesuffix("api/reports"),
    )  # fmt: skip
    assert await reporter.push_once() and reporter.next_delay() == reporter.report_interval
    assert not await reporter.push_once()  # too soon
    assert "429" in reporter.last_error
    assert reporter.next_delay() >= 100 and reporter.next_delay() > reporter.report_interval


# --- issue 28 item 12: known server pods and the state API keep budgets of their own ---------
#: the cluster holds one of the hub's server pods (KubeSpawner labels its pods
#: component=singleuser-server) and another pod; their addresses are the cluster's (the node
#: agent gives each pod its own loopback address on the real control plane)
TOPOLOGY = {
    "nodes": [{"name": "cpu-1"}],
    "pods": [
        {"name": "jupyter-bea-gpu", "namespace": "default", "node": "cpu-1",
         "labels": {"component": "singleuser-server"}, "podIP": "127.0.0.9"},
        {"name": "tenant-job", "namespace": "default", "node": "cpu-1",
         "labels": {"app": "job"}, "podIP": "127.0.0.10"},
    ],
}  # fmt: skip


async def post_from(url: str, source: str, token: str, body: dict) -> int:
    """A report posted from the address `source`: the status, 0 when closed unanswered."""
    where, raw = urlparse(url), json.dumps(body).encode()
    reader, writer = await asyncio.open_connection(
        where.hostname, where.port, local_addr=(source, 0)
    )
    writer.write(
        f"POST {where.path} HTTP/1.1\r\nHost: {where.netloc}\r\nAuthorization: token {token}"
        f"\r\nContent-Length: {len(raw)}\r\nConnection: close\r\n\r\n".encode()
        + raw
    )
    answer = await reader.read()
    writer.close()
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0


async def pod_ips(cluster, *names: str) -> list[str]:
    """The pods' addresses once the cluster has given each one."""
    for _ in range(300):
        found = {p["metadata"]["name"]: p.get("status", {}).get("podIP") for p in
                 await asyncio.to_thread(cluster.client().pods, "default")}  # fmt: skip
        if all(found.get(n) for n in names):
            return [found[n] for n in names]
        await asyncio.sleep(0.2)
    raise TimeoutError(f"no address for the pods {names}: {found}")


async def test_a_flood_of_random_tokens_cannot_blind_the_culler_to_real_servers(
    receiver, devcluster
):
    """Right after a culler restart (no token vouched for yet) random tokens from five
    addresses spend the shared budget of unknown tokens: a server pod the pod watch knows
    still gets its first report taken, and the admin page's first state call is answered;
    another pod's new token waits (429)."""
    culler, hub = receiver.culler, receiver.hub
    culler.watch_server_pods, culler.namespace = True, "default"
    culler.kubeconfig = str(devcluster.kubeconfig)
    culler.start_server_pods()
    try:
        server_ip, other_ip = await pod_ips(devcluster, "jupyter-bea-gpu", "tenant-job")
        await asyncio.wait_for(culler.server_pods.listed.wait(), 60)
        for _ in range(100):  # the watch sees the server pod's address once it has one
            if culler.known_address(server_ip):
                break
            await asyncio.sleep(0.2)
        assert culler.known_address(server_ip) and not culler.known_address(other_ip)
        hub.tokens["bea-token"] = {"kind": "user", "name": "bea",
                                   "scopes": ["access:servers!server=bea/gpu"]}  # fmt: skip
        hub.tokens["admin-token"] = {"kind": "user", "name": "admin", "scopes": ["read:servers"]}
        verifier = culler.verifier()
        verifier.limit.total_rate = verifier.state_limit.total_rate = 0.001  # no refill here
        await asyncio.gather(*(receiver.flood(60, source=f"127.0.0.{i}") for i in range(2, 7)))
        assert await post_from(receiver.url, other_ip, secrets.token_hex(16), report()) in (
            0,
            429,
        )  # the shared budget is spent
        assert await post_from(receiver.url, server_ip, "bea-token", report()) == 204
        assert await get_state(receiver.url, "admin-token", "127.0.0.7") == 200
    finally:
        await culler.server_pods.stop()


# --- issue 34 item 9: refused tokens cannot evict vouched ones; the service has a budget -------
# a cache of 20 tokens, every answer expired at once (each report re-asks the hub)
@pytest.mark.parametrize("receiver", [{"token_cache_size": 20}], indirect=True)
async def test_a_flood_of_random_tokens_cannot_evict_a_vouched_token(receiver):
    verifier = receiver.culler.verifier()
    verifier.ttl = 0.0
    assert (await receiver.post(report()))[0] == 204  # the hub vouches for ann's token
    verifier.limit.total_rate = 0.001  # no refill while the test runs
    # five pods: up to 250 random tokens refused by the hub, far more than the cache holds
    await asyncio.gather(*(receiver.flood(60, source=f"127.0.0.{i}") for i in range(2, 7)))
    assert verifier.requests > 20 + 1  # the hub refused more tokens than the cache holds
    asked = receiver.hub.asked
    # ann's token is still vouched for: re-checked with the hub past the spent budget
    assert (await receiver.post(report()))[0] == 204
    assert receiver.hub.asked == asked + 1
    assert len(verifier) <= 2 * 20  # vouched and refused, each bounded


async def state_flood(url: str, sources: range, n: int) -> list[int]:
    """n state calls with random tokens from each of 127.0.0.<sources>, 50 at a time."""
    gate = asyncio.Semaphore(50)

    async def one(source: str) -> int:
        async with gate:
            try:
                return await get_state(url, secrets.token_hex(16), source)
            except OSError:
                return 0

    return await asyncio.gather(*(one(f"127.0.0.{i}") for i in sources for _ in range(n)))


@pytest.mark.parametrize("receiver", [{"service_api_token": "service-token"}], indirect=True)
async def test_the_services_state_call_succeeds_during_a_flood(receiver):
    """Right after a culler restart (the service's token not vouched for yet) a flood of
    random tokens at the state API spends its overall budget: the admin page's state call,
    with the service's own token, still has a budget of its own."""
    receiver.hub.tokens["service-token"] = {
        "kind": "service",
        "name": "fracspawner",
        "scopes": ["list:users", "read:servers"],
    }
    verifier = receiver.culler.verifier()
    verifier.state_limit.total_rate = 0.001  # no refill while the test runs
    codes = await state_flood(receiver.url, range(2, 7), 60)
    assert 403 in codes and (429 in codes or 0 in codes)  # asked, then over budget
    assert await get_state(receiver.url, secrets.token_hex(16), "127.0.0.8") == 429
    assert await get_state(receiver.url, "service-token", "127.0.0.9") == 200
    # another token with the service's scopes (an admin's) still spends the shared budget
    receiver.hub.tokens["admin-token"] = {"kind": "user", "name": "a", "scopes": ["read:servers"]}
    assert await get_state(receiver.url, "admin-token", "127.0.0.10") == 429


# --- item 3: authenticate first, then parse strictly; 400 with the reason ----------------------
async def test_deep_nesting_is_refused_after_the_token_never_a_500(receiver):
    deep = b'{"culled_kernels": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    code, answer, _ = await receiver.post(deep, token="not-a-token")
    assert code == 403  # the token is checked before the body is parsed
    code, answer, _ = await receiver.post(deep)
    assert code == 400 and "nested deeper than" in answer["message"]


@pytest.mark.parametrize(
    ("raw", "field_named"),
    [
        ('"culled_kernels": [{"id": "k1", "gpu_memory_mib": NaN}]', "NaN"),
        ('"culled_kernels": [{"id": "k1", "gpu_memory_mib": Infinity}]', "Infinity"),
        ('"culled_kernels": [{"id": "k1", "gpu_memory_mib": 1e400}]', "out of range"),
        ('"culled_kernels": [{"id": "k1", "gpu_memory_mib": 1e300}]', "gpu_memory_mib"),
        ('"culled_kernels": [{"id": 7}]', "culled_kernels[0].id"),
        ('"culled_kernels": {"id": "k1"}', "culled_kernels: expected a list"),
        ('"reason": ["x"]', "reason: expected a string"),
    ],
)
async def test_malformed_numbers_and_types_are_400_and_metrics_stay_finite(
    receiver, raw, field_named
):
    body = json.dumps(report()).encode()[:-1] + b", " + raw.encode() + b"}"
    code, answer, _ = await receiver.post(body)
    assert code == 400 and field_named in answer["message"], answer
    reclaimed = receiver.sample("fracspawner_reclaimed_gpu_memory_mib_total", pool="")
    assert math.isfinite(reclaimed) and reclaimed == 0


async def test_a_non_list_of_unknown_reasons_is_400(receiver):
    body = report(
        available=True,
        sampled_at=T0,
        gpu_memory_mib=10,
        gpu_activity_known=False,
        gpu_unknown_reasons=5,
    )
    code, answer, _ = await receiver.post(body)
    assert code == 400 and "gpu_unknown_reasons: expected a list" in answer["message"]


async def test_report_text_cannot_forge_culler_log_lines(receiver, caplog):
    await listed(receiver)
    forged = "k1\n[I 2026-01-01 00:00:00.000 Culler] stop bob: idle for 9:00:00"
    with caplog.at_level(logging.INFO, logger=receiver.culler.log.name):
        code, _, _ = await receiver.post(report(culled_kernels=[{"id": forged[:64]}]))
    assert code == 204
    lines = [r.getMessage() for r in caplog.records if "idle kernel" in r.getMessage()]
    assert lines and all("\n" not in line for line in lines)
    assert "k1\\n[I 2026" in lines[0]  # escaped, still readable


# --- item 2: unknown tokens are rate-limited, cached briefly, evicted in O(1) ------------------
async def test_random_tokens_cost_the_hub_a_bounded_number_of_requests(receiver):
    receiver.culler._verifier.max_entries = 100  # the LRU bound, small to see it hold
    assert (await receiver.post(report()))[0] == 204  # a real server, the hub vouched for it
    asked = receiver.hub.asked
    started = time.monotonic()
    answers = await receiver.flood(600, source="127.0.0.2")
    took = time.monotonic() - started
    codes = [code for code, _ in answers]
    # a burst of 50 per address, then 5 a second; no more reach the hub
    assert receiver.hub.asked - asked <= 50 + 5 * took + 1, (receiver.hub.asked - asked, took)
    assert codes.count(403) <= 50 + 5 * took + 1
    # the rest: closed before being read (the address is over its budget), or 429
    assert codes.count(429) + codes.count(0) >= 600 - 50 - 5 * took - 1
    assert len(receiver.culler._verifier) <= 100
    # the real server, at another address, is not held up
    assert (await receiver.post(report()))[0] == 204


async def test_a_vouched_token_is_rechecked_past_the_limit(receiver):
    receiver.culler._verifier.ttl = 0.0  # every report re-asks the hub about the token
    assert (await receiver.post(report()))[0] == 204
    receiver.culler._verifier.limit.total_rate = 0.001  # no refill while the test runs
    # five pods spend their own buckets (50 each) and the overall one (200)
    await asyncio.gather(*(receiver.flood(60, source=f"127.0.0.{i}") for i in range(2, 7)))
    code, answer, headers = await receiver.post(report(), token=secrets.token_hex(16))
    assert code == 429  # an unknown token, even from a quiet address: the overall bucket
    assert "try again in" in answer["message"] and int(headers["Retry-After"]) >= 1
    asked = receiver.hub.asked
    assert (await receiver.post(report()))[0] == 204  # the real server's token still passes
    assert receiver.hub.asked == asked + 1  # and the hub was asked again (revocation works)
    receiver.hub.tokens.clear()  # the token is revoked
    code, _, _ = await receiver.post(report())
    assert code == 403


async def get_state(url: str, token: str, source: str) -> int:
    """`GET /api/state` with `token` from the address `source`: the status, 0 when closed."""
    where = urlparse(url)
    reader, writer = await asyncio.open_connection(
        where.hostname, where.port, local_addr=(source, 0)
    )
    writer.write(
        f"GET /api/state HTTP/1.1\r\nHost: {where.netloc}\r\n"
        f"Authorization: token {token}\r\nConnection: close\r\n\r\n".encode()
    )
    answer = await reader.read()
    writer.close()
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0


# a bucket of one unknown token per address, refilled every 100 s: one address spends it
@pytest.mark.parametrize("receiver", [{"unknown_token_rate": 0.01}], indirect=True)
async def test_one_address_cannot_spend_the_state_apis_budget_for_others(receiver):
    url = receiver.url  # the state API is served next to the reports (Culler.start_receiver)
    assert await get_state(url, secrets.token_hex(16), "127.0.0.2") == 403  # the hub asked
    # that address has spent its unknown tokens: closed at the door, or 429
    assert await get_state(url, secrets.token_hex(16), "127.0.0.2") in (0, 429)
    asked = receiver.hub.asked
    # another address still has its own: the hub is asked and says no (not 429)
    assert await get_state(url, secrets.token_hex(16), "127.0.0.3") == 403
    assert receiver.hub.asked == asked + 1


# a burst of 3 unknown tokens per address (the admin's token spends one, before the hub
# vouches for it), refilled slowly
@pytest.mark.parametrize("receiver", [{"unknown_token_rate": 0.3}], indirect=True)
async def test_state_api_requests_do_not_stay_pending_at_the_door(receiver):
    # the door (ReportServer) counts each connection as pending until its request is answered;
    # a state API request answered must count no more, or an address asking it more than its
    # burst of times (within PENDING_S) is closed unread from then on, its reports too
    url = receiver.url
    receiver.hub.tokens["admin-token"] = {
        "kind": "user",
        "name": "admin",
        "scopes": ["read:servers"],
    }
    for _ in range(6):
        assert await get_state(url, "admin-token", "127.0.0.4") == 200


def test_rate_limit_per_address_and_overall():
    from fracspawner.culler.identity import RateLimit

    limit = RateLimit(rate=1.0, burst=3, total_rate=2.0, total_burst=5, keys=2)
    assert [limit.take("a", 0.0) for _ in range(4)] == [0, 0, 0, 1.0]
    assert [limit.take("b", 0.0) == 0 for _ in range(3)] == [True, True, False]  # overall: 5
    assert limit.take("b", 1.0) == 0  # refilled: one per second overall and per address
    # the per-address table is an LRU: an evicted address comes back with a full bucket, and
    # the overall bucket still bounds it
    limit.take("c", 1.0)
    assert "a" not in limit._buckets and len(limit._buckets) == 2


# --- item 5: only dcgm-exporter's scrape job is GPU evidence ------------------------------------
class ForgingExporter:
    """A tenant's own exporter: series in dcgm-exporter's format, named for other users' pods
    (`exported_pod`, as they arrive from the real exporter behind a ServiceMonitor)."""

    def __init__(self) -> None:
        from tests.test_culler_support import DcgmExporter

        class Forger(DcgmExporter):
            @staticmethod
            def _labels(i: int, ns: str, pod: str) -> str:
                return f'gpu="{i}",exported_namespace="{ns}",exported_pod="{pod}"'

        self.exporter = Forger()


@pytest.fixture(scope="module")
def forged_prometheus(tmp_path_factory):
    """Debian's Prometheus scraping the dcgm-exporter stand-in (job dcgm-exporter, as in
    conftest) and a tenant's exporter in a job of its own, with honor_labels."""
    from tests.test_culler_support import DcgmExporter, Prometheus

    real, tenant = DcgmExporter(), ForgingExporter().exporter
    tenant_job = (
        "  - job_name: tenant-pods\n    honor_labels: true\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{tenant.port}']\n"
        "        labels: {pod: tenant-metrics-0, namespace: ann}\n"
    )
    prom = Prometheus(tmp_path_factory.mktemp("forged"), real.port, more_scrape_configs=tenant_job)
    try:
        yield real, tenant, prom
    finally:
        prom.stop()
        real.stop()
        tenant.stop()


async def test_a_tenants_exporter_cannot_make_gpu_evidence(forged_prometheus):
    from fracspawner.culler import combine, decide_server
    from fracspawner.culler.decide import ServerFacts
    from fracspawner.culler.hubapi import HubServer
    from tests.test_culler_support import prometheus_facts_of

    real, tenant, prom = forged_prometheus
    real.set("jupyter-victim", util=0, memory=8192, namespace="jhub")  # really idle
    tenant.set("jupyter-victim", util=100, memory=8192, namespace="jhub")  # "keep it busy"
    tenant.set("jupyter-ghost", util=0, memory=1024, namespace="jhub")  # no data -> "idle"
    prom.wait_scraped(9)
    assert prom.query('DCGM_FI_DEV_GPU_UTIL{exported_pod="jupyter-victim"}')  # both are there
    c = Culler(
        api_token="x",
        prometheus_url=prom.url,
        pod_label="exported_pod",
        namespace_label="exported_namespace",
        namespace="jhub",
        pod_name_template="jupyter-{username}",
        server_gpu_idle="3",
        server_idle="3600",
        max_sample_gap=5.0,
        coverage_step=1.0,
    )
    c.initialize([])
    now = time.time()
    servers = [
        HubServer(
            ServerFacts(u, user_options={"gpu": "1/4"}, started=now - 600, last_activity=now - 600),
            f"/user/{u}/",
        )
        for u in ("victim", "ghost")
    ]

    prom_facts = await prometheus_facts_of(c, servers, at=None)
    decided = {}
    for s in servers:
        facts, sources = c.gather(s, prom_facts, now)
        decided[s.facts.user] = decide_server(
            facts, combine(sources, now), c.policy_for(facts).policy, now
        )
    # the forged "busy" does not keep the idle victim; the forged "idle" culls nobody
    assert decided["victim"].reason == "gpu_idle", decided["victim"]
    assert decided["ghost"].action == "keep" and decided["ghost"].gpu_failsafe
    assert "prometheus has no data" in decided["ghost"].message


def test_the_dcgm_job_is_never_empty():
    c = Culler(api_token="x", prometheus_url="http://127.0.0.1:1", dcgm_job="")
    with pytest.raises(SystemExit, match="dcgm_job is empty"):
        c.initialize([])


# --- item 4: the culler's pool policy is the pool the pod is on, never user text ----------------
def strict_h100_catalog(tmp_path) -> str:
    """The demo catalog with a strict h100 (max_age 12 h, server_gpu_idle 15 m) beside the
    lenient catalog-wide policy, and everyone allowed on every pool."""
    from tests.conftest import DEMO_CATALOG

    text = DEMO_CATALOG.read_text()
    text = text.replace(
        '    offers: ["1/8", "1/4", "1/2", 10GiB, 20GiB, "1"]\n',
        '    offers: ["1/8", "1/4", "1/2", 10GiB, 20GiB, "1"]\n'
        "    idle: {server_gpu_idle: 15m, max_age: 12h}\n",
    )
    text = text.replace("default: {pools: [h100], max_gpu: 0.25}", "default: {pools: [h100, t4]}")
    path = tmp_path / "catalog.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("pool", "words"),
    [
        ("h100 ", "pool: 'h100 ' has spaces around it; give the name exactly, e.g. 'h100'."),
        ("", 'pool: "" is not a name; leave the option out for the default.'),
        (None, "pool: null is not a name; leave the option out for the default."),
    ],
)
async def test_a_pool_the_spawner_would_rewrite_is_refused(tmp_path, pool, words):
    from tornado.web import HTTPError

    from tests.hub_support import HubUsers, begin_spawn, refusal

    hub = HubUsers({"FracSpawner": {"catalog_file": strict_h100_catalog(tmp_path)}})
    spawner = hub.spawner(hub.user("mallory"))
    with pytest.raises(HTTPError) as refused:
        await begin_spawn(spawner, {"gpu": "1/4", "pool": pool})
    assert refused.value.status_code == 400 and refusal(refused.value) == words
    assert spawner.hold is None  # nothing half-made


async def test_the_culler_applies_the_policy_of_the_pool_the_pod_is_on(tmp_path):
    """Spawned with no pool (FracSpawner places it on h100), then the hub restarts: the
    server model still names h100, so the culler applies h100's strict policy, not the most
    lenient pool's that could serve a quarter GPU."""
    from jupyterhub.user import User

    from fracspawner.culler.decide import ServerFacts
    from tests.hub_support import HubUsers, begin_spawn

    catalog = strict_h100_catalog(tmp_path)
    hub = HubUsers({"FracSpawner": {"catalog_file": catalog}})
    user = hub.user("mallory")
    spawner = hub.spawner(user)
    options = {"gpu": "1/4"}
    spawner.orm_spawner.user_options = options  # what User.spawn stores (jupyterhub/user.py)
    pod = await begin_spawn(spawner, options)
    assert pod.metadata.labels["fracspawner.io/pool"] == "h100"
    spawner.orm_spawner.state = spawner.get_state()  # what the hub saves after start
    hub.db.commit()
    culler = Culler(api_token="x", catalog=catalog)
    culler.initialize([])
    # the running hub's server model (APIHandler.server_model: spawner.user_options)
    live = culler.policy_for(ServerFacts("mallory", user_options=spawner.user_options))
    # a restarted hub builds the spawner again from the database (User._new_spawner + load_state)
    again = hub.spawner(User(user.orm_user, settings=hub.settings(), db=hub.db))
    restarted = culler.policy_for(ServerFacts("mallory", user_options=again.user_options))
    for found in (live, restarted):
        assert found.pool == "h100"
        assert (found.policy.max_age, found.policy.server_gpu_idle) == (12 * 3600, 15 * 60)


# --- over-commit: a report is bound to its pod (issue 36, items 4 and 6) ----------------------
T4 = 15360.0  # NVML's total for a T4, the catalog's model
OVERCOMMITTED = {
    "pools": {"t4": {"gpu": "T4", "backend": "timeslicing", "replicas": 4, "overcommit": 2,
                     "offers": ["1/4"]}},
    "access": {"default": {"pools": "all", "max_gpu": 1}},
}  # fmt: skip


def swap_report(
    uuids: list[str], kernels_on: dict[str, float], waiting: float = 0.0, state: str = "idle"
) -> dict:
    """A report of an over-committed server: the devices it names, one kernel per entry of
    `kernels_on` (id -> MiB, in `state`) on the first device, and a resume waiting for
    `waiting` MiB on each of the first 64 devices it names (as many as a report may list)."""
    now = datetime.now(timezone.utc).isoformat()
    return report(
        available=True, sampled_at=now,
        devices=[{"index": str(i), "uuid": u, "memory_total_mib": T4, "memory_used_mib": T4 / 2}
                 for i, u in enumerate(uuids)],
        processes=[{"kernel_id": k, "device": "0", "gpu_memory_mib": mib, "matched": True}
                   for k, mib in kernels_on.items()],
        kernels=[{"id": k, "execution_state": state, "last_activity": T0, "gpu_memory_mib": mib,
                  "gpu_utilization": 0, "gpu_activity_known": True,
                  "hibernation": {"state": "running"}} for k, mib in kernels_on.items()],
        swap={"waiting": [{"kernel_id": f"w{i}", "gpu_memory_mib": waiting, "device": u}
                          for i, u in enumerate(uuids[:64]) if waiting]},
    )  # fmt: skip


def server_pod(user: str, node: str) -> dict:
    """The server's pod as the culler's pod watch lists it (KubeSpawner's name and label)."""
    return {
        "metadata": {"name": f"jupyter-{user}--gpu", "namespace": "jhub",
                     "labels": {"component": "singleuser-server"}},
        "spec": {"nodeName": node, "containers": [
            {"name": "notebook", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running", "podIP": f"10.0.0.{len(user)}"},
    }  # fmt: skip


@pytest.fixture
def overcommitted(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text(json.dumps(OVERCOMMITTED))
    return {"catalog": str(path), "namespace": "jhub"}


@pytest.mark.parametrize("mallory_node, victims", [("node-a", 3), ("node-b", 2)])
async def test_one_report_naming_128_gpus_moves_no_one_elses_kernels(
    receiver, overcommitted, mallory_node, victims
):
    """Mallory's report names 128 UUIDs, the victims' GPU among them, each with a resident
    kernel and a resume waiting for a whole GPU. The victims share GPU-B on node-b, each a
    quarter resident; the margin is a quarter. Mallory's word must move none of their idle
    kernels: from another node it does not count on GPU-B at all (three victims: the GPU is at
    its size less the margin, not above); on their node her claim on all GPUs together is her
    slice (two victims: with her quarter the GPU is still not above it)."""
    from fracspawner.culler.serverpods import ServerPods

    culler = receiver.culler
    for key, value in overcommitted.items():
        setattr(culler, key, value)
    culler._catalog = None
    culler.initialize([])
    victims = ["v1", "v2", "v3"][:victims]
    for user in [*victims, "mallory"]:
        receiver.hub.tokens[f"{user}-token"] = {
            "kind": "user", "name": user,
            "scopes": [f"access:servers!server={user}/gpu", f"users:activity!user={user}"],
        }  # fmt: skip
        now = datetime.now(timezone.utc).isoformat()
        receiver.hub.servers.setdefault(user, {})["gpu"] = {
            # started when its monitor did (the reports' monitor_started): a report from
            # before its server started is a previous incarnation's, and counts for nothing
            "user_options": {"gpu": "1/4", "pool": "t4"}, "started": T0, "last_activity": now
        }  # fmt: skip
    await culler.cull_once()
    pods = ServerPods("jhub")
    pods.load([server_pod(u, "node-b") for u in victims] + [server_pod("mallory", mallory_node)])
    culler.server_pods = pods
    uuids = ["GPU-B", *[f"GPU-{i:03d}" for i in range(127)]]
    mallory = swap_report(uuids, {"m1": T4}, waiting=T4, state="busy")  # never her own
    code, answer, _ = await receiver.post(mallory, token="mallory-token")
    assert code in (200, 204), answer
    for user in victims:
        code, answer, _ = await receiver.post(
            swap_report(["GPU-B"], {f"{user}-k": T4 / 4}), token=f"{user}-token"
        )
        assert code in (200, 204), answer
        assert not (answer or {}).get("swap", {}).get("hibernate"), (user, answer)
    # nor on mallory's next report, once every victim has reported
    code, answer, _ = await receiver.post(mallory, token="mallory-token")
    for user in victims:
        code, answer, _ = await receiver.post(
            swap_report(["GPU-B"], {f"{user}-k": T4 / 4}), token=f"{user}-token"
        )
        assert not (answer or {}).get("swap", {}).get("hibernate"), (user, answer)


DRA_POOL = {
    "pools": {"t4-dra": {"gpu": "T4", "backend": "dra", "options": {"sharing": "memory"},
                         "offers": ["1/4"]}},
    "access": {"default": {"pools": "all", "max_gpu": 1}},
}  # fmt: skip


async def test_a_dra_report_naming_a_gpu_its_claim_was_not_allocated_takes_no_room_there(
    receiver, tmp_path
):
    """Issue 36 item 4 on a DRA pool, through the culler's own answer to reports: Vic's claim
    was allocated gpu-0 of node-a, Mallory's gpu-1 (the claims' allocation results, the UUIDs
    from the node's ResourceSlice: tests/test_culler_placement_dra.py). Mallory reports Vic's
    GPU with a resume of half of it waiting since before Vic's quarter: counted there she would
    get the room and Vic's kernel would be told the GPU is full. Her claim is not on it: Vic's
    kernel gets the room."""
    from fracspawner.culler.serverpods import ServerPods
    from tests.test_culler_placement_dra import claim, node_slice, pod, uuid

    path = tmp_path / "catalog.yaml"
    path.write_text(json.dumps(DRA_POOL))
    culler = receiver.culler
    culler.catalog, culler.namespace, culler._catalog = str(path), "jhub", None
    culler.initialize([])
    for user in ("vic", "mallory"):
        receiver.hub.tokens[f"{user}-token"] = {
            "kind": "user", "name": user,
            "scopes": [f"access:servers!server={user}/gpu", f"users:activity!user={user}"],
        }  # fmt: skip
        now = datetime.now(timezone.utc).isoformat()
        receiver.hub.servers.setdefault(user, {})["gpu"] = {
            "user_options": {"gpu": "1/4", "pool": "t4-dra"}, "started": T0,  # as its monitor
            "last_activity": now,
        }  # fmt: skip
    await culler.cull_once()
    pods = ServerPods("jhub", dra=True)
    pods.load([pod(f"{u}--gpu", "node-a", template=f"{u}-gpu-1") for u in ("vic", "mallory")])
    pods.dra.load_claims(
        [claim(f"{u}-gpu-1", ("node-a", f"gpu-{i}"), memory="3840Mi")
         for i, u in enumerate(("vic", "mallory"))]
    )  # fmt: skip
    pods.dra.load_slices([node_slice("node-a")])
    culler.server_pods = pods
    gpu0 = uuid("node-a", 0)
    mallory = swap_report([gpu0], {"m1": T4 / 4}, waiting=T4 / 2, state="busy")
    code, answer, _ = await receiver.post(mallory, token="mallory-token")
    assert code in (200, 204), answer
    assert not (answer or {}).get("swap", {}).get("resume"), answer
    code, answer, _ = await receiver.post(swap_report([gpu0], {}, waiting=T4 / 4),
                                          token="vic-token")  # fmt: skip
    assert code == 200, answer
    assert answer["swap"].get("resume") == [{"kernel_id": "w0", "gpu_memory_mib": T4 / 4}], answer
