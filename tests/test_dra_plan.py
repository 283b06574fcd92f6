"""Issue 30 item 1: a `backend: dra` pool turns a slice into a ResourceClaimTemplate, the pod's
`spec.resourceClaims` and the GPU container's `resources.claims` (no extended resource), in
the shape NVIDIA's DRA driver documents (kubernetes-sigs/dra-driver-nvidia-gpu
demo/specs/consumable-shares/memory-sharing.yaml: `capacity.requests.memory: 4Gi` of
`gpu.nvidia.com`; demo/specs/quickstart/v1/gpu-test4.yaml: MIG by a CEL selector on
`device.attributes['gpu.nvidia.com'].profile`; gpu-test-mps.yaml: the GpuConfig opaque
config). The official schema of resource.k8s.io/v1 checks every template (kubernetes-validate).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import yaml

from fracspawner.backends import load_catalog, plan_slice
from fracspawner.backends.podspec import apply_plan
from fracspawner.cli.plan import bare_pod
from fracspawner.model.errors import CatalogError
from fracspawner.model.slices import parse_slice
from tests.hub_support import HubUsers, begin_spawn, stop

H100_DRA = {
    "display_name": "H100 (DRA)",
    "gpu": "H100-80GB",
    "backend": "dra",
    "options": {"sharing": "memory"},
    "offers": ["1/8", "1/4", "10GiB", "20GiB", "1"],
}
A100_DMIG = {
    "gpu": "A100-80GB",
    "backend": "dra",
    "options": {"mig": "dynamic"},
    "offers": ["mig-1g.10gb", "mig-3g.40gb", "1"],
}
CATALOG: dict[str, Any] = {
    "pools": {
        "h100-dra": H100_DRA,
        "a100-dmig": A100_DMIG,
        "t4": {"gpu": "T4", "backend": "timeslicing", "replicas": 4, "offers": ["1/4"]},
    }
}


def plan(spec: str, pool: str = "h100-dra", catalog: dict[str, Any] | None = None):
    cat = load_catalog(catalog or CATALOG)
    return plan_slice(parse_slice(spec), cat.pools[pool], None)


def request_of(template: dict[str, Any]) -> dict[str, Any]:
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    return request


def validate(obj: dict[str, Any]) -> None:
    """The apiserver's schema check (the official OpenAPI of Kubernetes 1.34)."""
    import kubernetes_validate

    kubernetes_validate.validate(json.loads(json.dumps(obj)), "1.34", strict=True)


def test_ten_gib_asks_the_driver_for_ten_gib_of_one_gpu_by_claim_not_resource():
    p = plan("10GiB")
    (template,) = p.claim_templates
    assert template["kind"] == "ResourceClaimTemplate"
    assert template["apiVersion"] == "resource.k8s.io/v1"
    request = request_of(template)
    assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    assert request["exactly"]["capacity"] == {"requests": {"memory": "10Gi"}}
    # the pool's model, by the attribute the driver publishes (deviceinfo.go productName)
    assert request["exactly"]["selectors"] == [
        {
            "cel": {
                "expression": "device.attributes['gpu.nvidia.com'].productName"
                " == 'NVIDIA H100 80GB HBM3'"
            }
        }
    ]
    pod = apply_plan(bare_pod("alice"), p)
    container = pod["spec"]["containers"][0]
    assert pod["spec"]["resourceClaims"] == [
        {"name": "gpu", "resourceClaimTemplateName": template["metadata"]["name"]}
    ]
    assert container["resources"]["claims"] == [{"name": "gpu"}]
    # no extended resource: the claim is the GPU
    assert not container["resources"].get("limits")
    # the CONTRACT keys, and the memory the meter reads
    assert pod["metadata"]["labels"]["fracspawner.io/pool"] == "h100-dra"
    assert pod["metadata"]["labels"]["fracspawner.io/gpu"] == "10Gi"
    assert pod["metadata"]["annotations"]["fracspawner.io/gpu-memory-mib"] == "10240"
    assert pod["metadata"]["annotations"]["fracspawner.io/gpu-equivalent"] == "0.125"
    validate({**template, "metadata": {**template["metadata"], "namespace": "jhub"}})
    validate({"apiVersion": "v1", "kind": "Pod", **pod})


def test_a_fraction_books_its_share_of_the_memory_the_device_reports():
    # 8 x 1/8 must fit the 81,559 MiB NVML reports (the driver publishes it, rounded to 1Mi)
    request = request_of(plan("1/8").claim_templates[0])
    assert request["exactly"]["capacity"]["requests"]["memory"] == "10194Mi"
    assert 8 * 10194 <= 81559


def test_memory_shares_are_booked_not_enforced_so_soft_caps_and_the_note_apply():
    p = plan("10GiB")
    assert not p.enforced
    assert p.env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert p.env["CUPY_GPU_MEMORY_LIMIT"] == str(10240 * 1024 * 1024)
    from fracspawner.choice.offers import summary

    cat = load_catalog(CATALOG)
    text = summary(parse_slice("10GiB"), cat.pools["h100-dra"], p.memory_mib, p.enforced)
    assert "not isolated" in text


def test_mig_profiles_are_claimed_by_cel_on_the_profile_and_isolated():
    p = plan("mig-1g.10gb", "a100-dmig")
    request = request_of(p.claim_templates[0])
    assert request["exactly"]["deviceClassName"] == "mig.nvidia.com"
    expressions = [s["cel"]["expression"] for s in request["exactly"]["selectors"]]
    assert "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'" in expressions
    assert "capacity" not in request["exactly"]
    assert p.enforced and "XLA_PYTHON_CLIENT_MEM_FRACTION" not in p.env
    validate({**p.claim_templates[0], "metadata": {**p.claim_templates[0]["metadata"]}})


def test_a_whole_gpu_on_a_memory_pool_asks_no_capacity_so_takes_all_of_it():
    # consumable_shares.go, mode memory: the request policy's default is the whole memory
    request = request_of(plan("1").claim_templates[0])
    assert "capacity" not in request["exactly"]
    unlimited = {"pools": {"u": {**H100_DRA, "options": {"sharing": "unlimited"}}}}
    # mode unlimited: the default is 0, a claim without a request would share the device
    request = request_of(plan("1", "u", unlimited).claim_templates[0])
    assert request["exactly"]["capacity"] == {"requests": {"memory": "81559Mi"}}


def test_integer_shares_and_gpu_config():
    shares = {
        "pools": {
            "s": {
                **H100_DRA,
                "options": {"sharing": "shares", "shares": 4, "time_slicing": "Long"},
                "offers": ["1/4", "1/2", "1"],
            }
        }
    }
    template = plan("1/2", "s", shares).claim_templates[0]
    assert request_of(template)["exactly"]["capacity"] == {"requests": {"shares": "2"}}
    # the driver's GpuConfig (api/nvidia.com/resource/v1beta1/gpuconfig.go, sharing.go)
    (config,) = template["spec"]["spec"]["devices"]["config"]
    assert config == {
        "requests": ["gpu"],
        "opaque": {
            "driver": "gpu.nvidia.com",
            "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
            },
        },
    }
    validate(template)


@pytest.mark.parametrize(
    ("options", "offers", "message"),
    [
        ({}, ["1/4"], "pools.p.offers[0]: 1/4: claims on this pool get whole devices"),
        ({"sharing": "shares"}, ["1"], "pools.p: options.shares"),
        ({"sharing": "shares", "shares": 4}, ["1/8"], "multiples of 1/4"),
        ({"sharing": "memory"}, ["mig-1g.10gb"], "set options.mig"),
        ({"sharing": "memory", "mps": True}, ["1"], "refuses MPS with consumable shares"),
        ({"sharing": "bytes"}, ["1"], "pools.p.options.sharing"),
        ({"sharing": "memory", "product_name": "it's"}, ["1"], "pools.p.options.product_name"),
        ({"shraing": "memory"}, ["1"], "pools.p.options: unknown key"),
        ({"sharing": "unlimited", "mig": "static"}, ["mig-1g.10gb"], "MIG device is shared"),
    ],
)
def test_a_pool_the_driver_cannot_serve_is_refused_with_its_path(options, offers, message):
    bad = {
        "pools": {"p": {"gpu": "H100-80GB", "backend": "dra", "options": options, "offers": offers}}
    }
    with pytest.raises(CatalogError) as err:
        load_catalog(bad)
    assert message in str(err.value)


def test_custom_model_needs_the_product_name_the_driver_publishes():
    gpu = {"name": "X1", "memory_mib": 16384}
    bad = {"pools": {"p": {"gpu": gpu, "backend": "dra", "offers": ["1"]}}}
    with pytest.raises(CatalogError, match="options.product_name"):
        load_catalog(bad)
    ok = {
        "pools": {
            "p": {"gpu": gpu, "backend": "dra", "offers": ["1"], "options": {"product_name": "any"}}
        }
    }
    request = request_of(plan("1", "p", ok).claim_templates[0])
    assert "selectors" not in request["exactly"]


def test_template_names_are_valid_and_distinct_per_offer_and_pool():
    from fracspawner.backends.dra import claim_template_name

    names = {
        claim_template_name(p, g) for p in ("h100", "H100", "h100_x") for g in ("0.125", "10Gi")
    }
    assert len(names) == 6
    for name in names:
        validate(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": name, "namespace": "n"},
                "spec": {"spec": {}},
            }
        )


def test_fracspawner_plan_shows_the_pod_with_its_claim_and_the_template(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(CATALOG))
    out = subprocess.run(
        [sys.executable, "-m", "fracspawner", "plan", "--catalog", str(path), "--gpu", "10GiB",
         "--pool", "h100-dra", "--with-templates"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    pod, template = yaml.safe_load_all(out.stdout)
    assert pod["kind"] == "Pod" and template["kind"] == "ResourceClaimTemplate"
    assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": "gpu"}]
    assert (
        pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
        == (template["metadata"]["name"])
    )
    assert template["metadata"]["namespace"] == pod["metadata"].get("namespace", "default")
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {
        "requests": {"memory": "10Gi"}
    }
    # the limits kubespawner writes hold no GPU resource
    limits = pod["spec"]["containers"][0]["resources"].get("limits") or {}
    assert not [k for k in limits if "nvidia" in k]
    # without --with-templates: the pod alone (the CONTRACT's output), the template named
    plain = subprocess.run(
        [sys.executable, "-m", "fracspawner", "plan", "--catalog", str(path), "--gpu", "10GiB",
         "--pool", "h100-dra", "-o", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(plain.stdout)["kind"] == "Pod"
    assert "ResourceClaimTemplate fracspawner-h100-dra-10gi" in plain.stderr


async def test_nothing_of_a_dra_spawn_leaks_into_the_next(tmp_path):
    hub = HubUsers({"FracSpawner": {"catalog": CATALOG}})
    spawner = hub.spawner(hub.user("lee"))
    pod = await begin_spawn(spawner, {"gpu": "10GiB", "pool": "h100-dra"})
    assert pod.spec.containers[0].resources.claims == [{"name": "gpu"}]
    assert pod.spec.resource_claims[0]["resourceClaimTemplateName"] == "fracspawner-h100-dra-10gi"
    assert [t["metadata"]["name"] for t in spawner.claim_templates()] == [
        "fracspawner-h100-dra-10gi"
    ]
    stop(spawner)
    for options in ({"gpu": "none"}, {"gpu": "1/4", "pool": "t4"}):
        pod = await begin_spawn(spawner, options)
        assert not pod.spec.resource_claims
        assert not (pod.spec.containers[0].resources.claims or [])
        assert spawner.claim_templates() == []
        stop(spawner)


# --------------------------------------------------------------------------- templates
class FakeResourceApi:
    """ResourceV1Api as the API server answers it for resourceclaimtemplates (k8s apiserver
    registry/generic/registry/store.go: create of an existing name is 409 AlreadyExists;
    update needs the current metadata.resourceVersion, else 409 Conflict; RBAC denial 403)."""

    def __init__(self, store: dict, forbidden: bool = False) -> None:
        self.store, self.forbidden, self.calls = store, forbidden, []

    def _deny(self) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        if self.forbidden:
            raise ApiException(status=403, reason="Forbidden")

    async def create_namespaced_resource_claim_template(self, namespace, body):
        from kubernetes_asyncio.client.exceptions import ApiException

        self.calls.append("create")
        self._deny()
        key = (namespace, body["metadata"]["name"])
        if key in self.store:
            raise ApiException(status=409, reason="AlreadyExists")
        self.store[key] = {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}

    async def read_namespaced_resource_claim_template(self, name, namespace, **_):
        self.calls.append("read")
        body = json.dumps(self.store[(namespace, name)]).encode()

        class Response:
            async def read(self):
                return body

        return Response()

    async def replace_namespaced_resource_claim_template(self, name, namespace, body):
        from kubernetes_asyncio.client.exceptions import ApiException

        self.calls.append("replace")
        current = self.store[(namespace, name)]
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        version = str(int(current["metadata"]["resourceVersion"]) + 1)
        self.store[(namespace, name)] = {
            **body,
            "metadata": {**body["metadata"], "resourceVersion": version},
        }


async def test_the_hub_makes_the_template_and_replaces_it_only_when_the_catalog_changed(
    monkeypatch,
):
    import kubernetes_asyncio.client as k8s

    from fracspawner.capacity.templates import ClaimTemplateError, ensure_claim_templates

    store: dict = {}
    api = FakeResourceApi(store)
    monkeypatch.setattr(k8s, "ResourceV1Api", lambda client: api)
    templates = plan("10GiB").claim_templates
    assert await ensure_claim_templates(None, "jhub", templates) == ["fracspawner-h100-dra-10gi"]
    assert store[("jhub", "fracspawner-h100-dra-10gi")]["metadata"]["namespace"] == "jhub"
    api.calls.clear()
    assert await ensure_claim_templates(None, "jhub", templates) == []  # the same: left alone
    assert api.calls == ["create", "read"]
    # the catalog now names the model differently: the template is replaced
    changed = {"pools": {"h100-dra": {**H100_DRA, "options": {"sharing": "memory",
                                                              "product_name": "any"}}}}  # fmt: skip
    new = plan("10GiB", "h100-dra", changed).claim_templates
    assert await ensure_claim_templates(None, "jhub", new) == ["fracspawner-h100-dra-10gi"]
    stored = store[("jhub", "fracspawner-h100-dra-10gi")]
    assert "selectors" not in stored["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    # no role for it: the spawn fails in words naming what the hub needs
    monkeypatch.setattr(k8s, "ResourceV1Api", lambda client: FakeResourceApi({}, True))
    with pytest.raises(ClaimTemplateError, match="needs get, create and update on"):
        await ensure_claim_templates(None, "jhub", templates)


def test_the_meter_reads_the_claims_memory_from_the_pod():
    """The JupyterLab meter's limit is FRACSPAWNER_GPU_MEMORY_MIB (serverext/podinfo.py), which
    a DRA pod carries as its claim's memory, as the annotation does."""
    from fracspawner.serverext.podinfo import PodInfo

    pod = apply_plan(bare_pod("alice"), plan("1/8"))
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    info = PodInfo.from_environ(env)
    assert info.memory_mib == 10194
    assert pod["metadata"]["annotations"]["fracspawner.io/gpu-memory-mib"] == "10194"


def test_a_mig_device_on_an_integer_shares_pool_is_claimed_whole():
    """The driver gives MIG devices the shares capacity too (consumable_shares.go applies to
    MigDynamicDeviceType): a MIG claim asks all N shares, so nobody shares its device."""
    pools = {"pools": {"m": {**A100_DMIG, "options": {"mig": "dynamic", "sharing": "shares",
                                                       "shares": 4}}}}  # fmt: skip
    request = request_of(plan("mig-1g.10gb", "m", pools).claim_templates[0])
    assert request["exactly"]["capacity"] == {"requests": {"shares": "4"}}
