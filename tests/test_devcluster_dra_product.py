"""fracspawner's own DRA plans on the devcluster's DRA cluster: the pods and ResourceClaimTemplates
`fracspawner plan --with-templates` prints for examples/catalogs/dra.yaml, applied to
devcluster/topologies/dra.yaml, are allocated as NVIDIA's driver and the scheduler would
(issue 30's acceptance: seven 10 GiB servers share one H100 80GB of 81,559 MiB, an eighth waits).
Only the container command is replaced (`sleep`: no notebook server is needed here)."""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from devcluster import DevCluster
from devcluster.admission import RequestInfo

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
CATALOG = REPO / "examples" / "catalogs" / "dra.yaml"
TOPOLOGY = REPO / "devcluster" / "topologies" / "dra.yaml"


def plan(gpu: str, pool: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "fracspawner", "plan", "--catalog", str(CATALOG), "--gpu", gpu,
         "--pool", pool, "--with-templates", "-o", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["items"]


async def spawn(cluster: DevCluster, items: list[dict], count: int, tag: str) -> list[str]:
    pod, templates = items[0], items[1:]
    ns = pod["metadata"].get("namespace") or "default"
    for template in templates:
        template["metadata"]["namespace"] = ns
        await cluster.api_create(
            "resourceclaimtemplates.resource.k8s.io", "v1", ns, template, RequestInfo()
        )
    names = []
    for i in range(count):
        body = copy.deepcopy(pod)
        body["metadata"]["name"] = f"{tag}-{i}"
        body["metadata"]["namespace"] = ns
        body["spec"]["containers"][0]["command"] = ["sleep", "600"]
        body["spec"]["containers"][0].pop("args", None)
        await cluster.api_create("pods", "v1", ns, body, RequestInfo())
        names.append(f"{tag}-{i}")
    return names


async def settle(cluster: DevCluster, names: list[str], placed: int) -> Counter:
    """Wait until `placed` of the pods are bound and the others have a FailedScheduling."""
    deadline = time.monotonic() + 30
    while True:
        pods = {
            p["metadata"]["name"]: p for p in cluster.list("pods") if p["metadata"]["name"] in names
        }
        bound = Counter(p["spec"]["nodeName"] for p in pods.values() if p["spec"].get("nodeName"))
        waiting = [
            n for n, p in pods.items()
            if not p["spec"].get("nodeName") and any(
                e["reason"] == "FailedScheduling"
                for e in cluster.events_for(p["metadata"]["namespace"], n)
            )
        ]  # fmt: skip
        if sum(bound.values()) == placed and len(waiting) == len(names) - placed:
            return bound
        assert time.monotonic() < deadline, f"bound {bound}, waiting {waiting}"
        await asyncio.sleep(0.05)


async def test_the_products_dra_plans_are_allocated_as_the_driver_would(tmp_path: Path):
    memory = await asyncio.to_thread(plan, "10GiB", "h100-dra")
    mig = await asyncio.to_thread(plan, "mig-3g.40gb", "a100-dynamic-mig")
    quarter = await asyncio.to_thread(plan, "1/4", "l40s-dra-ts")
    async with DevCluster(TOPOLOGY, state_dir=tmp_path / "state") as cluster:
        # 2 x H100 of 81,559 MiB: 7 x 10 GiB each, the 15th waits
        names = await spawn(cluster, memory, 15, "mem")
        assert await settle(cluster, names, 14) == Counter({"gpu-h100-dra": 14})
        # dynamic MIG on one A100 80GB: two 3g.40gb made from its counters, a third waits
        names = await spawn(cluster, mig, 3, "mig")
        assert await settle(cluster, names, 2) == Counter({"gpu-a100-dmig": 2})
        # --consumable-shares=4: four quarters of the L40S
        names = await spawn(cluster, quarter, 5, "quarter")
        assert await settle(cluster, names, 4) == Counter({"gpu-l40s-dra": 4})
        claims = cluster.list("resourceclaims.resource.k8s.io")
        consumed = Counter(
            json.dumps(r.get("consumedCapacity"), sort_keys=True)
            for c in claims if (c.get("status") or {}).get("allocation")
            for r in c["status"]["allocation"]["devices"]["results"]
        )  # fmt: skip
        assert consumed[json.dumps({"memory": "10Gi"})] == 14
        assert consumed[json.dumps({"memory": "0", "shares": "1"})] == 4
        made = sorted(
            r["device"]
            for c in claims if (c.get("status") or {}).get("allocation")
            for r in c["status"]["allocation"]["devices"]["results"] if "mig" in r["device"]
        )  # fmt: skip
        assert made == ["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-3g40gb-9-4"]
        # the template's labels travel to each claim (the capacity watch reads them)
        labelled = [c for c in claims if c["metadata"]["name"].startswith("mem-")]
        assert all(c["metadata"]["labels"].get("fracspawner.io/pool") == "h100-dra"
                   for c in labelled)  # fmt: skip
