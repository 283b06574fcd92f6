"""The scale benchmark's DRA cluster (benchmarks/dra_scale.py) makes its pods as FracSpawner
plans them (issue 35 item 3: claims made from the product's ResourceClaimTemplates by
kube-controller-manager and allocated by kube-scheduler), and its topology is the node agent's
DRA node format. No cluster starts here; the benchmark itself runs on the real control plane."""

from __future__ import annotations

import json

from benchmarks import dra_scale
from devcluster.topology import load_topology


def test_pods_name_the_products_claim_templates_as_plain_json() -> None:
    offers = dra_scale.Offers(dra_scale.catalog())
    templates = {t["metadata"]["name"]: t for t in offers.templates()}
    assert set(templates) == {
        "fracspawner-h100-dra-10gi",
        "fracspawner-h100-dra-20gi",
        "fracspawner-a100-dmig-mig-1g.10gb",
    }
    pod = offers.pod("jupyter-dra00001", ("h100-dra", "20GiB"))
    json.dumps(pod)  # no read-only mappings left: it goes over the wire as it is
    (claim,) = pod["spec"]["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == "fracspawner-h100-dra-20gi"
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["claims"] == [{"name": claim["name"]}]
    assert pod["metadata"]["labels"]["component"] == "singleuser-server"
    assert pod["metadata"]["labels"]["fracspawner.io/pool"] == "h100-dra"
    request = templates["fracspawner-h100-dra-20gi"]["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"]["capacity"]["requests"] == {"memory": "20Gi"}


def test_topology_is_half_memory_share_h100_half_dynamic_mig_a100() -> None:
    topology = load_topology(dra_scale.topology(nodes=4))
    names = [n["metadata"]["name"] for n in topology["nodes"]]
    assert names == ["h100-dra-000", "h100-dra-001", "a100-dmig-000", "a100-dmig-001"]
    assert topology["dra"]["h100-dra-000"]["consumableShares"] == "memory"
    assert topology["dra"]["a100-dmig-001"]["mig"] == "dynamic"
    assert topology["dra"]["a100-dmig-001"]["gpus"] == dra_scale.GPUS
