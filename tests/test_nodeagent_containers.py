"""Every container of a pod in the node agent's run mode, as a kubelet runs them (issue 35):
init containers in order, each to completion before the next (kubernetes.io, "Init Containers"),
sidecars (init containers with restartPolicy Always, KEP-753: started before the next init
container and kept running; "Sidecar Containers") and every app container, each with its own
status, and the pod's Initialized condition. What `kubectl get pod` shows is checked as it
prints it (READY, STATUS, RESTARTS). docs/controlplane.md "Node agent"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devcluster.controlplane import ControlPlane
from devcluster.network import sandboxes
from devcluster.nodeagent import NodeAgent
from tests.nodeagent_support import explained
from tests.realcluster_support import control_plane_fixture, node_agent_fixture
from tests.test_controlplane import eventually, get_json, kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
NS = "multi"


cp = control_plane_fixture()
agent = node_agent_fixture(
    {"nodes": [{"name": "multi-node", "capacity": {"cpu": "8"}}]},
    namespaces=[NS], mode="run", restart_backoff=(1.0, 4.0),
)  # fmt: skip


def sh(name: str, script: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "image": "busybox", "command": ["sh", "-c", script], **more}


def create(cp: ControlPlane, name: str, containers: list, init: list = (), **spec: Any) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": containers, "initContainers": list(init), **spec},
    }
    kubectl(cp, "create", "-f", "-", stdin=pod)


def pod(cp: ControlPlane, name: str) -> dict[str, Any]:
    return get_json(cp, "pod", name, "-n", NS)


def printed(cp: ControlPlane, name: str) -> tuple[str, str, str]:
    """(READY, STATUS, RESTARTS) as `kubectl get pod` prints them."""
    line = kubectl(cp, "get", "pod", name, "-n", NS, "--no-headers").stdout.split()
    return line[1], line[2], line[3]


def shows(
    cp: ControlPlane, agent: NodeAgent, name: str, ready: str, status: str, restarts: str = "0"
) -> None:
    """Wait until `kubectl get pod` prints READY, STATUS and RESTARTS; else fail with what it
    printed last, the pod's status, events and logs and what the agent knows of it."""
    want = (ready, status, restarts)
    with explained(cp, NS, name, agent):
        try:
            eventually(lambda: printed(cp, name) == want, f"{name}: {' '.join(want)}")
        except AssertionError as err:
            raise AssertionError(f"{err}; it shows {printed(cp, name)}") from None


def conditions(p: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in p["status"].get("conditions") or []}


def statuses(p: dict[str, Any], key: str = "containerStatuses") -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in p["status"].get(key) or []}


WORK = {"volumes": [{"name": "work", "emptyDir": {}}]}
MOUNT = {"volumeMounts": [{"name": "work", "mountPath": "/work"}]}
#: the sidecar is started once its file is there: only then does the app container start
STARTED = {"exec": {"command": ["test", "-f", "/work/sidecar-up"]}, "periodSeconds": 1,
           "failureThreshold": 60}  # fmt: skip


def test_an_init_container_runs_to_completion_and_leaves_a_file_the_app_reads(cp, agent):
    create(
        cp,
        "init-file",
        [sh("app", "cat /work/greeting; sleep 600", **MOUNT)],
        init=[sh("prepare", "sleep 4; echo hello from init > /work/greeting", **MOUNT)],
        restartPolicy="Never",
        **WORK,
    )
    # while the init container runs: Pending, Init:0/1, not Initialized, the app waiting
    with explained(cp, NS, "init-file", agent):
        during = eventually(lambda: printed(cp, "init-file")[1] == "Init:0/1"
                            and pod(cp, "init-file"), "Init:0/1")  # fmt: skip
    assert during["status"]["phase"] == "Pending"
    initialized = conditions(during)["Initialized"]
    assert initialized["status"] == "False", initialized
    assert initialized["reason"] == "ContainersNotInitialized", initialized
    assert "prepare" in initialized["message"], initialized
    app = statuses(during)["app"]
    assert app["state"]["waiting"]["reason"] == "PodInitializing", app
    assert printed(cp, "init-file")[0] == "0/1"

    shows(cp, agent, "init-file", "1/1", "Running")
    done = pod(cp, "init-file")
    prepare = statuses(done, "initContainerStatuses")["prepare"]
    assert prepare["state"]["terminated"]["exitCode"] == 0, prepare
    assert prepare["state"]["terminated"]["reason"] == "Completed", prepare
    assert conditions(done)["Initialized"]["status"] == "True"
    assert statuses(done)["app"]["state"]["running"], done["status"]
    # the app read what the init container wrote into the pod's emptyDir
    logs = lambda: kubectl(cp, "logs", "init-file", "-n", NS, "-c", "app").stdout  # noqa: E731
    assert eventually(lambda: "hello from init" in logs(), "the app's log") and logs().strip() == (
        "hello from init"
    ), logs()


def test_a_failing_init_container_restarts_and_the_pod_stays_initializing(cp, agent):
    create(
        cp,
        "init-fails",
        [sh("app", "sleep 600")],
        init=[sh("check", "exit 3")],
        restartPolicy="Always",
    )

    def looping() -> dict | None:
        p = pod(cp, "init-fails")
        check = statuses(p, "initContainerStatuses").get("check") or {}
        return p if check.get("restartCount", 0) >= 1 else None

    with explained(cp, NS, "init-fails", agent):
        p = eventually(looping, "the init container restarted")
    check = statuses(p, "initContainerStatuses")["check"]
    assert check["lastState"]["terminated"]["exitCode"] == 3, check
    assert p["status"]["phase"] == "Pending"
    assert "state" in statuses(p)["app"] and statuses(p)["app"]["state"].get("waiting"), p
    assert printed(cp, "init-fails")[1] in ("Init:Error", "Init:CrashLoopBackOff")
    assert conditions(p)["Initialized"]["status"] == "False"


def test_a_failing_init_container_fails_a_pod_that_never_restarts(cp, agent):
    create(cp, "init-never", [sh("app", "sleep 600")], init=[sh("check", "exit 5")],
           restartPolicy="Never")  # fmt: skip
    with explained(cp, NS, "init-never", agent):
        eventually(lambda: pod(cp, "init-never")["status"].get("phase") == "Failed", "Failed")
    p = pod(cp, "init-never")
    check = statuses(p, "initContainerStatuses")["check"]
    assert check["state"]["terminated"]["exitCode"] == 5, check
    assert "running" not in (statuses(p)["app"].get("state") or {}), p["status"]
    assert printed(cp, "init-never")[1] == "Init:Error"


def test_two_app_containers_run_and_one_exiting_leaves_the_pod_running_not_ready(cp, agent):
    wait = "while [ ! -f /work/done ]; do sleep 0.2; done"
    create(
        cp,
        "two-apps",
        [sh("server", "sleep 600", **MOUNT), sh("job", f"{wait}; exit 0", **MOUNT)],
        restartPolicy="Never",
        **WORK,
    )
    shows(cp, agent, "two-apps", "2/2", "Running")
    # the job ends (told through the server's exec, in the same emptyDir): the server still
    # runs, so the pod is Running but not Ready
    kubectl(cp, "exec", "two-apps", "-n", NS, "-c", "server", "--", "touch", "/work/done")
    shows(cp, agent, "two-apps", "1/2", "NotReady")
    p = pod(cp, "two-apps")
    assert p["status"]["phase"] == "Running"
    job, server = statuses(p)["job"], statuses(p)["server"]
    assert job["state"]["terminated"]["exitCode"] == 0 and not job["ready"], job
    assert server["state"]["running"] and server["ready"], server
    assert conditions(p)["ContainersReady"]["status"] == "False"
    assert "job" in conditions(p)["ContainersReady"]["message"]
    # the first app container is the runner's own
    assert (NS, "two-apps") in agent.runtime.kubelet.running


def test_a_sidecar_starts_before_the_app_keeps_running_and_counts_for_ready(cp, agent):
    create(
        cp,
        "sidecar",
        [sh("app", "test -f /work/sidecar-up || exit 9; sleep 600", **MOUNT)],
        init=[
            sh(
                "helper",
                "sleep 2; touch /work/sidecar-up; sleep 600",
                restartPolicy="Always",
                startupProbe=STARTED,
                **MOUNT,
            )  # fmt: skip
        ],
        restartPolicy="Never",
        **WORK,
    )
    shows(cp, agent, "sidecar", "2/2", "Running")
    p = pod(cp, "sidecar")
    helper = statuses(p, "initContainerStatuses")["helper"]
    assert helper["state"]["running"] and helper["started"] and helper["ready"], helper
    assert statuses(p)["app"]["state"]["running"], p["status"]
    assert conditions(p)["Initialized"]["status"] == "True"
    assert conditions(p)["Ready"]["status"] == "True"


def test_every_container_of_a_deleted_pod_is_stopped(cp, agent):
    create(cp, "stopall", [sh("a", "sleep 600"), sh("b", "sleep 600")],
           init=[sh("side", "sleep 600", restartPolicy="Always")],
           terminationGracePeriodSeconds=2)  # fmt: skip
    with explained(cp, NS, "stopall", agent):
        eventually(lambda: printed(cp, "stopall")[0] == "3/3", "3/3 ready")
    kubectl(cp, "delete", "pod", "stopall", "-n", NS, "--wait=true", "--timeout=60s")
    home = agent.runtime.kubelet.pod_dir(NS, "stopall")
    left = []
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if str(home).encode() in environ:
            left.append(proc.name)
    assert not left, f"processes of the deleted pod left: {left}"


@pytest.mark.skipif(not sandboxes(), reason="needs root and util-linux unshare")
def test_a_restarted_container_keeps_its_siblings_files_under_a_mount_path_the_host_lacks(
    cp, agent, tmp_path
):
    """A mountPath whose parent the host lacks is made on the host as an empty mount point,
    with a directory of the container's own bound over it (devcluster/bindmounts.py): its
    rootfs, which a container's start empties (a new container starts from a fresh layer).
    Only its own: a sibling that crashes and restarts leaves what the other container wrote
    there, and what the restarted one writes stays its own, never on the host's mount point."""
    top = tmp_path / "not-on-the-host"
    data = {"volumeMounts": [{"name": "work", "mountPath": str(top / "data")}]}
    create(
        cp,
        "siblings",
        [sh("keeper", f"echo kept > {top}/note; sleep 600", **data),
         sh("crasher", f"echo mine > {top}/own; sleep 2; exit 1", **data)],
        restartPolicy="Always",
        **WORK,
    )  # fmt: skip
    with explained(cp, NS, "siblings", agent):
        # no containerStatuses until the node agent's first status write (a pod just bound, as
        # before the kubelet's first sync): not restarted yet
        eventually(
            lambda: statuses(pod(cp, "siblings")).get("crasher", {}).get("restartCount", 0) >= 2,
            "crasher restarted twice",
        )
    seen = kubectl(cp, "exec", "siblings", "-n", NS, "-c", "keeper", "--", "ls", "-A", str(top),
                   check=False)  # fmt: skip
    kept = kubectl(cp, "exec", "siblings", "-n", NS, "-c", "keeper", "--", "cat", f"{top}/note",
                   check=False)  # fmt: skip
    assert kept.stdout == "kept\n", f"keeper's file lost: {kept.stderr} (it sees {seen.stdout!r})"
    assert seen.stdout.split() == ["data", "note"], seen  # not the crasher's
    assert sorted(p.name for p in top.iterdir()) == [], "written on the host's mount point"
    kubectl(cp, "delete", "pod", "siblings", "-n", NS, "--wait=false")
