"""The hub's pod view after an API-server restart and after a 410 Gone (issue 37's "Measure"),
KubeSpawner's PodReflector against FracSpawner's ResumingPodReflector, side by side in one
process (`python -m benchmarks.recovery KUBECONFIG`, driven by `measure`) on the scale cluster.

- restart: kube-apiserver alone is stopped and started again (etcd, the scheduler and the
  controller manager stay up); once it is ready, 10 single-user pods are created and 10 deleted.
- 410: kube-apiserver restarted without a watch cache for pods (`--watch-cache-sizes=pods#0`:
  watches then read etcd, the "short watch cache" of the issue), 10 pods created and 10 deleted
  while both views follow, then etcd compacted at its head revision and each reflector's next
  watch asked from a version before it (version 1: etcd's progress bookmarks may otherwise move
  a resuming reflector past the compaction before it resumes, and with its watch cache the
  1.36 apiserver answered a watch from version 1 with no event and no error): the apiserver
  answers 410 Gone ("The resourceVersion for the provided watch is too old.") and each lists
  again.

Each time: seconds from the fault (the apiserver ready again, or the compaction) until each
view (namespace/name -> uid) equals a fresh list taken after the changes; pods missed (in the
list, not in the view) and kept (in the view, gone from the list) when it is not whole within
RECOVERY_TIMEOUT; whether it is still whole 3 s later; how many lists each reflector made since
the scenario before (kubespawner's lists again every 10 s whatever happens).
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LABELS = {"component": "singleuser-server"}
CHANGES = 10
RECOVERY_TIMEOUT = 120.0
POLL_SECONDS = 0.05
#: counted by the child from its start; each scenario reports the difference: list requests
#: (refused ones too, while the apiserver is down), lists that completed, 410s
COUNTED = (
    ("kubespawner", "list_requests"),
    ("fracspawner", "list_requests"),
    ("fracspawner", "lists_completed"),
    ("fracspawner", "410s"),
)


# ----------------------------------------------------------------------------- the views
def _view(reflector: Any) -> dict[str, str]:
    return {
        key: (pod.get("metadata") or {}).get("uid", "") for key, pod in list(reflector.pods.items())
    }


class _ListCounter:
    """The reflector's API object, counting the lists it asks for (watches pass through)."""

    def __init__(self, api: Any) -> None:
        self.api, self.lists = api, 0
        self.rewind: str | None = None  # the next watch resumes from this version instead

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.api, name)
        if not name.startswith("list_"):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            if not kwargs.get("watch"):
                self.lists += 1
            elif self.rewind is not None:
                kwargs["resource_version"], self.rewind = self.rewind, None
            return method(*args, **kwargs)

        call.__doc__ = method.__doc__  # kubernetes_asyncio's Watch reads the return type there
        return call


class _Gone(logging.Handler):
    """Counts the ResumingReflector's "listing again" lines: each one is a 410 Gone."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "listing again" in record.getMessage() and "Cannot watch" not in record.msg:
            self.count += 1


async def _wait_whole(arms: dict[str, Any], want: dict[str, str], t0: float) -> dict[str, Any]:
    pending = dict(arms)
    out: dict[str, Any] = {}
    deadline = time.time() + RECOVERY_TIMEOUT
    while pending and time.time() < deadline:
        for name, reflector in list(pending.items()):
            if _view(reflector) == want:
                out[name] = {"seconds_to_whole": round(time.time() - t0, 2)}
                del pending[name]
        await asyncio.sleep(POLL_SECONDS)
    for name, reflector in pending.items():
        view = _view(reflector)
        out[name] = {
            "seconds_to_whole": None,
            "missed": sum(1 for k, uid in want.items() if view.get(k) != uid),
            "kept": sum(1 for k in view if k not in want),
        }
    await asyncio.sleep(3)
    for name, reflector in arms.items():
        out[name]["still_whole_3s_later"] = _view(reflector) == want
    return out


def _totals(arms: dict[str, Any], gone: _Gone) -> dict[str, int]:
    """COUNTED, since the child started."""
    return {
        "kubespawner.list_requests": arms["kubespawner"].api.lists,
        "fracspawner.list_requests": arms["fracspawner"].api.lists,
        "fracspawner.lists_completed": arms["fracspawner"].lists,
        "fracspawner.410s": gone.count,
    }


async def _child(kubeconfig: str) -> None:
    from kubernetes_asyncio import config
    from kubespawner.spawner import PodReflector

    from fracspawner.hub.reflectors import ResumingPodReflector

    await config.load_kube_config(config_file=kubeconfig)
    gone = _Gone()
    arms = {
        "kubespawner": PodReflector(namespace="default", labels=LABELS),
        "fracspawner": ResumingPodReflector(namespace="default", labels=LABELS),
    }
    log = arms["fracspawner"].log
    log.addHandler(gone)
    log.setLevel(logging.INFO)  # the 410 line is at info level
    log.propagate = False
    for reflector in arms.values():
        reflector.api = _ListCounter(reflector.api)
        await reflector.start()
    ready = {k: len(r.pods) for k, r in arms.items()}
    print(json.dumps({"ready": ready, "totals": _totals(arms, gone)}), flush=True)
    loop = asyncio.get_running_loop()
    while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
        command, path, t0 = line.split()
        want = json.loads(Path(path).read_text())
        gone_before = gone.count
        result: dict[str, Any] = {}
        if command == "expect410":  # each one's next watch resumes from a compacted version
            for reflector in arms.values():
                reflector.api.rewind = "1"
            deadline = time.time() + RECOVERY_TIMEOUT
            while gone.count == gone_before and time.time() < deadline:
                await asyncio.sleep(POLL_SECONDS)
            result["fracspawner_410_after_s"] = (
                round(time.time() - float(t0), 2) if gone.count > gone_before else None
            )
        result.update(await _wait_whole(arms, want, float(t0)))
        # cumulative: the driver takes the differences (a list may come before this command)
        for key, total in _totals(arms, gone).items():
            arm, counted = key.split(".")
            result[arm][counted] = total
        print(json.dumps(result), flush=True)
    for reflector in arms.values():
        await reflector.stop()


# ----------------------------------------------------------------------------- the driver
def _pod(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(LABELS)},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "notebook", "image": "quay.io/jupyter/base-notebook"}],
        },
    }


def _change(cluster: Any, tag: str) -> None:
    """CHANGES spawns (pods created) and CHANGES stops (background pods deleted)."""
    api, path = cluster.api, "/api/v1/namespaces/default/pods"
    for i in range(CHANGES):
        api.ok("POST", path, _pod(f"recover-{tag}-{i}", cluster.background[i]))
    victims = [n for n in cluster.pod_names(selector="component=singleuser-server")
               if n.startswith("jupyter-user")][:CHANGES]  # fmt: skip
    for name in victims:
        api.ok("DELETE", f"{path}/{name}", {"gracePeriodSeconds": 0}, allow=(404,))


def _fresh(cluster: Any, where: Path) -> Path:
    listing = cluster.api.ok(
        "GET", "/api/v1/namespaces/default/pods?labelSelector=component%3Dsingleuser-server"
    )
    want = {f"default/{p['metadata']['name']}": p["metadata"]["uid"] for p in listing["items"]}
    where.write_text(json.dumps(want))
    return where


def measure(cluster: Any) -> dict[str, Any]:
    """Both scenarios on `cluster` (a benchmarks.real_cluster.ScaleCluster); run it last: the
    apiserver is left without its pods watch cache."""
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.recovery", str(cluster.kubeconfig)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert child.stdin is not None and child.stdout is not None

    totals: dict[str, int] = {}

    def ask(command: str, want: Path, t0: float) -> dict[str, Any]:
        """The child's answer, with the lists (and 410s) made since the previous answer."""
        child.stdin.write(f"{command} {want} {t0}\n")
        child.stdin.flush()
        answer = json.loads(child.stdout.readline())
        for arm, key in COUNTED:
            total = answer[arm][key]
            answer[arm][key] = total - totals.get(f"{arm}.{key}", 0)
            totals[f"{arm}.{key}"] = total
        return answer

    out: dict[str, Any] = {"changes": {"created": CHANGES, "deleted": CHANGES}}
    try:
        ready = json.loads(child.stdout.readline())
        out["initial_pods"] = ready["ready"]
        totals.update(ready["totals"])
        with tempfile.TemporaryDirectory() as tmp:
            restart_s = cluster.restart_apiserver()
            t0 = time.time()
            _change(cluster, "r")
            out["restart"] = ask("expect", _fresh(cluster, Path(tmp) / "r.json"), t0)
            out["restart"]["apiserver_down_s"] = round(restart_s, 2)

            restart_s = cluster.restart_apiserver(["--watch-cache-sizes=pods#0"])
            t0 = time.time()
            _change(cluster, "n")
            out["restart_without_watch_cache"] = ask(
                "expect", _fresh(cluster, Path(tmp) / "n.json"), t0
            )
            out["restart_without_watch_cache"]["apiserver_down_s"] = round(restart_s, 2)

            _change(cluster, "g")
            want = _fresh(cluster, Path(tmp) / "g.json")
            time.sleep(2)  # the changes reach both views through their watches
            out["compacted_at_revision"] = cluster.compact_etcd()
            out["gone_410"] = ask("expect410", want, time.time())
    finally:
        child.stdin.close()
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    return out


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_child(sys.argv[1]))
