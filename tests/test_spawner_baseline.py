"""The clean baseline (issue 14, item 14): every spawn starts from the configuration, so nothing
of an earlier spawn leaks (kubespawner#546), and what JupyterHub's hooks, run-time settings and
`load_state` set for THIS spawn reaches the pod. Spawns run JupyterHub's sequence on real hub
users (tests/hub_support.py)."""

from __future__ import annotations

from typing import Any

from tests.hub_support import HubUsers, begin_spawn, stop


def auth_state_hook(spawner: Any, auth_state: Any) -> None:
    # written the way admins write them: in-place changes to the trait values
    team = (auth_state or {}).get("team", "none")
    spawner.environment["TEAM"] = team
    spawner.extra_labels["example.org/team"] = team


def pre_spawn_hook(spawner: Any) -> None:
    spawner.environment["FROM_PRE_SPAWN"] = "yes"
    spawner.cpu_limit = 2.0
    if spawner.user_options.get("gpu", "none") != "none":
        spawner.extra_labels["example.org/gpu-user"] = "yes"
        spawner.volumes.append({"name": "scratch", "emptyDir": {}})
        spawner.volume_mounts.append({"name": "scratch", "mountPath": "/scratch"})


HOOKS = {
    "KubeSpawner": {
        "auth_state_hook": auth_state_hook,
        "pre_spawn_hook": pre_spawn_hook,
        "environment": {"SITE": "configured"},
        "node_selector": {"zone": "a"},
    }
}


def env(pod) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env}


def fracspawner_keys(mapping: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in mapping.items() if k.startswith("fracspawner.io/")}


def gpu_limits(pod) -> dict[str, str]:
    limits = pod.spec.containers[0].resources.limits or {}
    return {k: v for k, v in limits.items() if k not in ("cpu", "memory")}


async def test_what_hooks_set_reaches_the_pod_and_leaves_with_its_spawn():
    hub = HubUsers(HOOKS)
    spawner = hub.spawner(hub.user("lee", groups=("ml-research",)))

    pod = await begin_spawn(
        spawner, {"gpu": "mig-1g.10gb", "pool": "a100-mig"}, auth_state={"team": "vision"}
    )
    values = env(pod)
    assert values["TEAM"] == "vision" and values["FROM_PRE_SPAWN"] == "yes"
    assert values["SITE"] == "configured"
    assert pod.metadata.labels["example.org/team"] == "vision"
    assert pod.metadata.labels["example.org/gpu-user"] == "yes"
    assert "scratch" in {v.name for v in pod.spec.volumes}
    assert "/scratch" in {m.mount_path for m in pod.spec.containers[0].volume_mounts}
    assert float(pod.spec.containers[0].resources.limits["cpu"]) == 2.0
    assert gpu_limits(pod) == {"nvidia.com/mig-1g.10gb": "1"}
    stop(spawner)

    # the next spawn: CPU only, another team. Nothing of the GPU spawn, nor of what the
    # hooks set for it, is left; what they set for this one is there.
    pod = await begin_spawn(spawner, {"gpu": "none"}, auth_state={"team": "nlp"})
    values = env(pod)
    assert values["TEAM"] == "nlp" and values["SITE"] == "configured"
    assert "FRACSPAWNER_GPU_MEMORY_MIB" not in values
    assert pod.metadata.labels["example.org/team"] == "nlp"
    assert "example.org/gpu-user" not in pod.metadata.labels
    assert not [k for k in pod.metadata.labels if k.startswith("fracspawner.io/")]
    assert not [k for k in pod.metadata.annotations or {} if k.startswith("fracspawner.io/")]
    assert "scratch" not in {v.name for v in pod.spec.volumes or []}
    assert gpu_limits(pod) == {}
    assert pod.spec.node_selector == {"zone": "a"}
    # and the configuration itself was never changed in place
    assert spawner.config.KubeSpawner.environment == {"SITE": "configured"}


async def test_a_profile_list_set_by_a_hook_is_used():
    """z2jh sites build per-user profile lists in auth_state_hook / pre_spawn_hook."""

    def profiles_for_user(spawner: Any, auth_state: Any) -> None:
        spawner.profile_list = [
            {
                "display_name": "Small",
                "slug": "small",
                "default": True,
                "kubespawner_override": {"cpu_limit": 1.0},
            },
            {
                "display_name": "Big",
                "slug": "big",
                "kubespawner_override": {"cpu_limit": 8.0, "mem_limit": "32G"},
            },
        ]

    hub = HubUsers({"KubeSpawner": {"auth_state_hook": profiles_for_user}})
    spawner = hub.spawner(hub.user("pia"))
    pod = await begin_spawn(spawner, {"profile": "big", "gpu": "1/4", "pool": "h100"})
    assert float(pod.spec.containers[0].resources.limits["cpu"]) == 8.0
    assert pod.metadata.labels["fracspawner.io/gpu"] == "0.25"
    stop(spawner)
    # the profile's overrides do not outlive their spawn
    assert spawner.cpu_limit is None and spawner.profile_list == []


async def test_a_runtime_change_before_load_user_options_is_kept():
    """kubespawner's own tests set traits on the spawner and then call load_user_options."""
    hub = HubUsers()
    spawner = hub.spawner(hub.user("rui"))
    spawner.environment = {"existing": "existing-value"}
    spawner.user_options = {"gpu": "none"}
    await spawner.load_user_options()
    assert env(await spawner.get_pod_manifest())["existing"] == "existing-value"


async def test_the_namespace_from_state_is_kept():
    """After a hub restart, a server's namespace comes from its state (kubespawner keeps
    pods and PVCs where they were even if the configured namespace changed)."""
    hub = HubUsers({"KubeSpawner": {"namespace": "jhub"}})
    user = hub.user("sam")
    first = hub.spawner(user)
    first.orm_spawner.state = {"namespace": "team-a", "pod_name": "jupyter-sam"}
    hub.db.commit()

    spawner = hub.spawner(hub.user("sam"))  # a new hub process loads the state
    assert spawner is not first
    assert spawner.namespace == "team-a"
    await begin_spawn(spawner, {"gpu": "1/4", "pool": "h100"})
    assert spawner.namespace == "team-a"
    stop(spawner)
    assert spawner.namespace == "team-a"
    assert spawner.get_state()["namespace"] == "team-a"


async def test_a_profile_namespace_stays_with_its_spawn_across_a_restart():
    profiles = [
        {"display_name": "Default", "slug": "default", "default": True, "kubespawner_override": {}},
        {
            "display_name": "GPU team",
            "slug": "gpu-team",
            "kubespawner_override": {"namespace": "gpu-team"},
        },
    ]
    hub = HubUsers({"KubeSpawner": {"namespace": "jhub", "profile_list": profiles}})
    spawner = hub.spawner(hub.user("max"))
    await begin_spawn(spawner, {"profile": "gpu-team", "gpu": "none"})
    assert spawner.namespace == "gpu-team"
    spawner.orm_spawner.state = spawner.get_state()  # persisted while it runs
    hub.db.commit()

    again = hub.spawner(hub.user("max"))  # hub restart: the running server is in gpu-team
    assert again.namespace == "gpu-team"
    stop(again)
    await begin_spawn(again, {"profile": "default", "gpu": "none"})
    assert again.namespace == "jhub"


async def test_changing_one_spawn_in_place_leaves_other_spawns_of_that_offer_alone():
    """Spawns of one offer share its plan (plan_slice is memoized): changing in place what a
    spawn's traits hold after its plan was applied changes that spawn only, not the next
    user's pod nor this server's next spawn."""
    hub = HubUsers()
    options = {"gpu": "1/4", "pool": "h100"}
    ana, ben = hub.spawner(hub.user("ana")), hub.spawner(hub.user("ben"))

    def facts(pod) -> tuple:
        return (
            fracspawner_keys(pod.metadata.labels),
            fracspawner_keys(pod.metadata.annotations),
            dict(pod.spec.node_selector),
            gpu_limits(pod),
            {k: v for k, v in env(pod).items() if k.startswith("FRACSPAWNER_GPU")},
        )

    planned = facts(await begin_spawn(ana, options))
    assert planned[2] == {"gpu": "on"} and planned[3]["nvidia.com/gpu"] == "1"
    for trait in ("extra_labels", "extra_annotations", "node_selector", "environment"):
        for key in getattr(ana, trait):
            getattr(ana, trait)[key] = "changed"
    ana.extra_resource_limits["nvidia.com/gpu"] = "8"

    assert facts(await begin_spawn(ben, options)) == planned
    stop(ana)
    assert facts(await begin_spawn(ana, options)) == planned
