"""What the spawn path's cheaper bookkeeping (issue 28 item 14) must keep doing, on real hub users
(tests/hub_support.py builds FracSpawners as JupyterHub does).

- The clean baseline: a spawner no longer computes every trait's class default when it is
  created (most were never read); what a hook changes in place on such a trait, in a later
  spawner of the class too, is still gone at the next spawn (kubespawner#546).
- The pod's environment: kubespawner expands `{username}`-style templates in the admin's
  `environment` (KubeSpawner.get_env, `_expand_env` -> str.format); the variables FracSpawner
  sets from the catalog are its own text, not templates, and reach the pod as written.
"""

from __future__ import annotations

from typing import Any

import yaml

from tests.conftest import DEMO_CATALOG
from tests.hub_support import HubUsers, begin_spawn, stop


def env(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env}


def scratch_hook(spawner: Any) -> None:
    # in place, as admins write hooks: traits nothing had read before this spawn
    if spawner.user_options.get("gpu", "none") == "none":
        return
    spawner.volumes.append({"name": "scratch", "emptyDir": {}})
    spawner.volume_mounts.append({"name": "scratch", "mountPath": "/scratch"})
    spawner.extra_pod_config["hostNetwork"] = False
    spawner.lifecycle_hooks["postStart"] = {"exec": {"command": ["true"]}}


async def test_in_place_changes_to_untouched_traits_leave_with_their_spawn():
    hub = HubUsers({"KubeSpawner": {"pre_spawn_hook": scratch_hook}})
    # the first spawner of the class, then others: each starts from the configuration
    for name in ("ada", "bo", "cy"):
        spawner = hub.spawner(hub.user(name))
        pod = await begin_spawn(spawner, {"gpu": "1/4", "pool": "h100"})
        assert "scratch" in {v.name for v in pod.spec.volumes}
        assert pod.spec.containers[0].lifecycle.post_start is not None
        stop(spawner)
        pod = await begin_spawn(spawner, {"gpu": "none"})  # the hook leaves this one alone
        assert "scratch" not in {v.name for v in pod.spec.volumes or []}, name
        assert not pod.spec.containers[0].volume_mounts or "/scratch" not in {
            m.mount_path for m in pod.spec.containers[0].volume_mounts
        }
        lifecycle = pod.spec.containers[0].lifecycle
        assert not lifecycle, name  # kubespawner leaves {} for no hooks
        assert spawner.extra_pod_config == {} and spawner.volumes == [], name
        stop(spawner)


async def test_catalog_text_reaches_the_pods_env_as_written(tmp_path):
    """A pool display name with braces used to fail the spawn (KeyError from str.format)."""
    catalog = yaml.safe_load(DEMO_CATALOG.read_text())
    catalog["pools"]["h100"]["display_name"] = "H100 {shared} 80GB (HAMi)"
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(catalog))
    hub = HubUsers(
        {
            "FracSpawner": {"catalog_file": str(path)},
            "KubeSpawner": {"environment": {"WHO": "{username}", "SITE": "lab"}},
        }
    )
    spawner = hub.spawner(hub.user("ada"))
    pod = await begin_spawn(spawner, {"gpu": "1/4", "pool": "h100"})
    values = env(pod)
    assert values["FRACSPAWNER_GPU_POOL_DISPLAY"] == "H100 {shared} 80GB"
    assert values["FRACSPAWNER_GPU_POOL"] == "h100"
    # the admin's own variables are still templates, as kubespawner documents
    assert values["WHO"] == "ada" and values["SITE"] == "lab"
    stop(spawner)


def _event(pod: str, uid: str, last: str | None, event_time: str | None = None) -> dict[str, Any]:
    """A core/v1 Event as the API serves it (both times present, one of them null)."""
    return {
        "metadata": {"name": f"{pod}.{uid}", "namespace": "default", "uid": uid},
        "involvedObject": {"kind": "Pod", "name": pod, "namespace": "default"},
        "reason": "Scheduled",
        "type": "Normal",
        "message": f"{pod} {uid}",
        "lastTimestamp": last,
        "eventTime": event_time,
    }


async def test_a_pods_events_are_kubespawners_without_sorting_the_namespace(monkeypatch):
    """FracSpawner.events picks the pod's events before sorting (a storm's spawns and every
    pending page read them while the namespace's events pile up); what it returns is exactly
    kubespawner's answer: the pod's events oldest first (lastTimestamp, else eventTime; equal
    times in the reflector's order), after the `_last_event` marker of an earlier pod."""
    from kubespawner import KubeSpawner
    from kubespawner.reflector import ResourceReflector
    from kubespawner.spawner import EventReflector

    class Events:  # kubespawner's own EventReflector.events over these resources
        events = property(EventReflector.events.fget)

        def __init__(self, resources: dict[str, Any]) -> None:
            self.resources = resources

    assert issubclass(EventReflector, ResourceReflector)
    hub = HubUsers()
    spawner = hub.spawner(hub.user("ada"))
    mine = spawner.pod_name
    others = [
        _event(f"jupyter-other{i}", f"o{i}", f"2026-11-27T03:{i % 60:02d}:00Z") for i in range(300)
    ]
    ours = [
        _event(mine, "old", "2026-11-27T02:59:00Z"),  # the earlier pod of that name
        _event(mine, "b", "2026-11-27T03:10:00Z"),
        _event(mine, "a", None, "2026-11-27T03:05:00.123456Z"),  # events.k8s.io: eventTime only
        _event(mine, "c", "2026-11-27T03:10:00Z"),  # the same second as b: after it, as listed
    ]
    resources = {
        f"default/{e['metadata']['name']}": e for e in [*others[:150], *ours, *others[150:]]
    }
    monkeypatch.setattr(KubeSpawner, "event_reflector", property(lambda self: Events(resources)))

    def kubespawners() -> list[dict[str, Any]]:
        return KubeSpawner.events.fget(spawner)

    for marker in (None, "old", "a", "c", "gone"):
        spawner._last_event = marker
        assert spawner.events == kubespawners(), marker
    spawner._last_event = "old"
    assert [e["metadata"]["uid"] for e in spawner.events] == ["a", "b", "c"]
    monkeypatch.setattr(KubeSpawner, "event_reflector", property(lambda self: None))
    assert spawner.events == []
