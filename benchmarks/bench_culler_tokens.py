"""Random tokens at the culler's report endpoint (issue 20 item 2): how long does a real server's
report wait while another pod sends 10,000 reports with random tokens?

The culler's real receiver (`Culler.start_receiver`: TokenVerifier, ReportStore, metrics) runs in
this process; a stand-in for the hub's `GET /hub/api/user` (403 for a token it does not know,
after a 5 ms lookup, else the owner's model, as jupyterhub/apihandlers/users.py SelfAPIHandler
answers) and the attacking pod each run in a subprocess of their own, so neither shares the
culler's event loop or interpreter. A real server posts a report every 50 ms with its own token,
re-checked with the hub every time (token_cache_seconds 0: the worst case, a cache entry that
has just expired). Each report's latency is measured:

- quiet: no attack (the baseline every figure is compared against, same run);
- attack: 10,000 random tokens, 100 at a time, with this culler;
- attack, verifier of before issue 20: the same with the TokenVerifier of commit 6ebac9d (no rate
  limit, cache rebuilt above 10,000 entries), loaded from git when the checkout has the history.

`delay_ms` is each percentile under attack minus the same percentile quiet (max: minus the quiet
p99); the target is <= 100 ms. The attack from another pod runs ROUNDS times
(`delay_ms_rounds`); `met_p95`: every round's p95 within it, `met_max`: every round's max.
An attack from the real server's own address (a proxy in front of both) is measured too: the
culler then closes that address's connections while it is over budget, the real one's included
(`real_reports_refused`), which is never idle.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from devcluster.localhub import free_port

TOKENS = 10_000
ROUNDS = 3  # attacks from another pod (the machine is shared: one report's tail is noisy)
PARALLEL = 100
EVERY = 0.05  # seconds between the real server's reports
HUB_LOOKUP = 0.005  # the stand-in hub's time to look a token up
ATTACKER_NICE = 10
BEFORE = "6ebac9d"  # the commit before issue 20's verifier
REAL_TOKEN = "real-server-token"
MODEL = {
    "kind": "user",
    "name": "ann",
    "scopes": ["access:servers!server=ann/gpu", "users:activity!user=ann"],
}
REPORT = {
    "server_name": "gpu",
    "available": False,
    "reason": "no GPU reading yet",
    "monitor_started": "2026-01-01T00:00:00+00:00",
    "server_last_activity": "2026-01-01T00:00:00+00:00",
}


# --- the subprocesses ----------------------------------------------------------------------
def _hub(port: int) -> None:
    from tornado import web
    from tornado.httpserver import HTTPServer

    class WhoAmI(web.RequestHandler):
        async def get(self) -> None:
            await asyncio.sleep(HUB_LOOKUP)
            token = self.request.headers.get("Authorization", "").partition(" ")[2]
            if token != REAL_TOKEN:
                raise web.HTTPError(403)
            self.write(json.dumps(MODEL))

        def log_exception(self, *args: Any) -> None:
            pass

    async def main() -> None:
        HTTPServer(
            web.Application([(r"/hub/api/user", WhoAmI)], log_function=lambda h: None)
        ).listen(port, "127.0.0.1")
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def _attack(url: str, n: int, source: str) -> None:
    """n reports with random tokens, PARALLEL at a time, from the address `source` (a pod's)."""
    from urllib.parse import urlparse

    where = urlparse(url)
    body = json.dumps(REPORT).encode()
    # in a cluster the attacking pod has CPUs of its own; here it shares the culler's, so it
    # yields to the culler (nice 10) instead of taking half the machine
    os.nice(ATTACKER_NICE)

    async def one(codes: dict[str, int]) -> None:
        head = (
            f"POST {where.path} HTTP/1.1\r\nHost: {where.netloc}\r\n"
            f"Authorization: token {secrets.token_hex(16)}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        try:
            reader, writer = await asyncio.open_connection(
                where.hostname, where.port, local_addr=(source, 0)
            )
            writer.write(head + body)
            await writer.drain()
            answer = await reader.read()
            writer.close()
        except OSError:
            answer = b""
        code = answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/") else "closed"
        codes[code] = codes.get(code, 0) + 1

    async def main() -> dict[str, Any]:
        codes: dict[str, int] = {}
        print("ready", flush=True)  # imports done: the attack itself starts on "go"
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        started = time.perf_counter()
        gate = asyncio.Semaphore(PARALLEL)

        async def limited() -> None:
            async with gate:
                await one(codes)

        await asyncio.gather(*(limited() for _ in range(n)))
        return {"seconds": round(time.perf_counter() - started, 2), "codes": codes}

    print(json.dumps(asyncio.run(main())), flush=True)


# --- the culler side -----------------------------------------------------------------------
def _old_verifier_class() -> type | None:
    """TokenVerifier as of BEFORE, from git (None without the history)."""
    root = Path(__file__).resolve().parent.parent
    try:
        source = subprocess.run(
            ["git", "show", f"{BEFORE}:fracspawner/culler/identity.py"],
            cwd=root, capture_output=True, text=True, check=True, timeout=30,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    path = Path(tempfile.mkdtemp()) / "identity_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("identity_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)

    class Before(module.TokenVerifier):  # today's receiver asks model(token, source)
        from fracspawner.culler.identity import RateLimit

        limit = RateLimit(1e9, 1e9, 1e9, 1e9)  # never asked: no buckets, every request let in

        async def model(self, token: str, source: str = "") -> dict:
            try:
                return await super().model(token)
            except module.Refused as exc:
                from fracspawner.culler.identity import Refused

                raise Refused(exc.code, str(exc)) from None

    return Before


def _stats(latencies: list[float]) -> dict[str, float]:
    ms = sorted(x * 1000 for x in latencies)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    return {
        "reports": len(ms),
        "p50_ms": round(statistics.median(ms), 1),
        "p95_ms": round(ms[min(len(ms) - 1, int(0.95 * len(ms)))], 1),
        "p99_ms": round(p99, 1),
        "max_ms": round(ms[-1], 1),
    }


async def _measure(
    hub_url: str, verifier_class: type | None, tokens: int, source: str = "127.0.0.2"
) -> dict[str, Any]:
    from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

    from fracspawner.culler import Culler

    port = free_port()
    culler = Culler(
        api_token="x",
        url=hub_url,
        report_url=f"http://127.0.0.1:{port}",
        report_prefix="/",
        token_cache_seconds=0.0,
        # the real server reports every EVERY seconds to measure the verifier: its per-server
        # report rate (3 a minute, issue 28) is not what is measured here
        report_rate=1e9,
        report_burst=1e9,
    )
    culler.initialize([])
    if verifier_class is not None:
        culler._verifier = verifier_class(hub_url, ttl=0.0)
    server = culler.start_receiver()
    if verifier_class is not None:
        server.verifier = None  # no gate then: it reads today's rate limit
    url = f"http://127.0.0.1:{port}/api/reports"
    client = AsyncHTTPClient(force_instance=True)
    latencies: list[float] = []
    when: list[float] = []
    failed: dict[int, int] = {}

    async def real_server(until: asyncio.Future) -> None:
        while not until.done():
            req = HTTPRequest(
                url,
                method="POST",
                body=json.dumps(REPORT),
                headers={"Authorization": f"token {REAL_TOKEN}"},
                connect_timeout=600,
                request_timeout=600,
            )
            started = time.perf_counter()
            try:
                code = (await client.fetch(req, raise_error=False)).code
            except (OSError, HTTPClientError):  # closed by the gate (an address over budget)
                code = 599
            latencies.append(time.perf_counter() - started)
            when.append(started)
            if code != 204:
                failed[code] = failed.get(code, 0) + 1
            await asyncio.sleep(EVERY)

    loop = asyncio.get_running_loop()
    until = loop.create_future()
    reporter = asyncio.ensure_future(real_server(until))
    attack: dict[str, Any] = {}
    try:
        await asyncio.sleep(0.5)  # the real server's token is known to the hub
        if tokens:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "benchmarks.bench_culler_tokens", "attack", url,
                str(tokens), source, stdout=asyncio.subprocess.PIPE,
                stdin=asyncio.subprocess.PIPE, cwd=Path(__file__).resolve().parent.parent,
            )  # fmt: skip
            assert proc.stdout is not None and proc.stdin is not None
            assert (await proc.stdout.readline()).strip() == b"ready"
            latencies.clear()  # only reports sent while the attack runs count
            when.clear()
            go = time.perf_counter()
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
            out, _ = await proc.communicate()
            attack = json.loads(out.decode().strip().splitlines()[-1])
        else:
            await asyncio.sleep(5)
        until.set_result(None)
        await reporter
    finally:
        client.close()
        server.stop()
        culler._verifier.close()
    result = {**_stats(latencies), "real_reports_refused": failed}
    print(f"   {source if tokens else 'quiet'}: {result}", file=sys.stderr, flush=True)
    if tokens:
        slow = sorted(zip(latencies, when, strict=True), reverse=True)[:3]
        shown = [(round(a * 1000), round(b - go, 2)) for a, b in slow]
        print("   slowest (ms, s after go):", shown, file=sys.stderr, flush=True)
    if attack:
        result["attack"] = attack
        limited = getattr(culler._verifier, "limited", None)
        result["hub_requests"] = culler._verifier.requests
        if limited is not None:
            result["unknown_tokens_limited"] = limited
    return result


async def _bench(hub_url: str) -> dict[str, Any]:
    import logging

    logging.getLogger("tornado.access").setLevel(logging.ERROR)  # 10,000 lines of 403/429
    quiet = await _measure(hub_url, None, 0)
    rounds = [await _measure(hub_url, None, TOKENS, source="127.0.0.2") for _ in range(ROUNDS)]
    other = rounds[0]
    same = await _measure(hub_url, None, TOKENS, source="127.0.0.1")
    out: dict[str, Any] = {
        "quiet": quiet,
        "attack_from_another_pod": other,
        "attack_from_the_same_address": same,
    }
    before = _old_verifier_class()
    if before is not None:
        out["attack_from_another_pod_verifier_before"] = await _measure(
            hub_url, before, TOKENS, source="127.0.0.2"
        )

    def delay(attacked: dict[str, Any]) -> dict[str, float]:
        return {
            "p50": round(attacked["p50_ms"] - quiet["p50_ms"], 1),
            "p95": round(attacked["p95_ms"] - quiet["p95_ms"], 1),
            "p99": round(attacked["p99_ms"] - quiet["p99_ms"], 1),
            "max": round(attacked["max_ms"] - quiet["p99_ms"], 1),
        }

    out["delay_ms"] = delay(other)
    out["delay_ms_rounds"] = [delay(r) for r in rounds]
    out["delay_ms_same_address"] = delay(same)
    if before is not None:
        out["delay_ms_before"] = delay(out["attack_from_another_pod_verifier_before"])
    out["target_ms"] = 100
    # every round: 95 % of the real server's reports within 100 ms of the quiet figure, none
    # refused; the max (one report, on a shared machine) is reported beside it
    out["met_p95"] = all(
        d["p95"] <= 100 and not r["real_reports_refused"]
        for d, r in zip(out["delay_ms_rounds"], rounds, strict=True)
    )
    out["met_max"] = all(d["max"] <= 100 for d in out["delay_ms_rounds"])
    return out


def run(results_dir: Path) -> dict[str, Any]:
    port = free_port()
    hub = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bench_culler_tokens", "hub", str(port)],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent,
        env={**os.environ},
    )  # fmt: skip
    try:
        assert hub.stdout is not None and hub.stdout.readline().strip() == "ready"
        result = asyncio.run(_bench(f"http://127.0.0.1:{port}/hub/api"))
    finally:
        hub.terminate()
        hub.wait(10)
    result["load_average_1m"] = round(os.getloadavg()[0], 1)  # the machine is shared
    result["setup"] = {
        "tokens": TOKENS,
        "parallel": PARALLEL,
        "report_every_s": EVERY,
        "hub_lookup_s": HUB_LOOKUP,
        "attacker_nice": ATTACKER_NICE,
        "token_cache_seconds": 0.0,
    }
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["hub"]:
        _hub(int(sys.argv[2]))
    elif sys.argv[1:2] == ["attack"]:
        _attack(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        print(json.dumps(run(Path(__file__).parent / "results"), indent=2))
