"""FracSpawner next to Zero to JupyterHub (z2jh) 4.4.0: the pod z2jh's own hub config produces.

z2jh's chart cannot be fetched here; tests/z2jh_support.py reproduces the parts that matter
(its defaults, Helm's value composition, jupyterhub_config.py's user scheduler, metadata-block
init container, services, roles and extraConfig), citing z2jh's files. HAMi's admission
webhook is reproduced from Project-HAMi/HAMi pkg/scheduler/webhook.go (same module).
"""

from __future__ import annotations

import pytest
import yaml

from fracspawner.cli.plan import build_manifest
from tests.conftest import REPO
from tests.z2jh_support import hami_webhook, hub_config, merged_values

OVERLAY = yaml.safe_load((REPO / "examples" / "z2jh" / "values.yaml").read_text())
CATALOGS = REPO / "examples" / "catalogs"


async def z2jh_pod(catalog: str, options: dict, *config_layers: dict) -> dict:
    """The pod FracSpawner creates in a z2jh hub configured with the operator's values
    (`config_layers`) and then examples/z2jh/values.yaml, as `helm upgrade -f ... -f ...`."""
    values = merged_values(*config_layers, OVERLAY)
    path = str(CATALOGS / catalog)
    c = hub_config(values, release="jhub", catalog_file=path)
    return await build_manifest(path, options, admin=True, config=c)


# ------------------------------------------------------------------ item 1: own schedulers
@pytest.mark.parametrize(
    ("catalog", "options", "scheduler"),
    [
        ("hami.yaml", {"gpu": "1/4", "pool": "h100"}, "hami-scheduler"),
        ("hami.yaml", {"gpu": "10GiB", "pool": "h100"}, "hami-scheduler"),
        ("volcano.yaml", {"gpu": "1/4", "pool": "a100-volcano"}, "volcano"),
        ("runai.yaml", {"gpu": "1/4", "pool": "a100-runai"}, "runai-scheduler"),
        ("runai.yaml", {"gpu": "1/4", "pool": "l40s-kai"}, "kai-scheduler"),
    ],
)
async def test_backends_with_their_own_scheduler_name_it_under_z2jhs_user_scheduler(
    catalog, options, scheduler
):
    """z2jh's default `scheduling.userScheduler.enabled: true` sets
    c.KubeSpawner.scheduler_name = "<fullname>-user-scheduler"; a slice of a backend whose
    scheduler books the GPU must name that scheduler whatever z2jh set."""
    pod = await z2jh_pod(catalog, options, {})
    assert pod["spec"]["schedulerName"] == scheduler


async def test_a_hami_slice_under_z2jh_defaults_passes_hamis_webhook():
    """With z2jh's defaults (user scheduler + the privileged block-cloud-metadata init
    container) the pod HAMi's webhook receives is admitted and handed to HAMi's scheduler."""
    pod = await z2jh_pod("hami.yaml", {"gpu": "1/4", "pool": "h100"}, {})
    answer = hami_webhook(pod)
    assert answer["allowed"], answer["message"]
    assert answer["pod"]["spec"]["schedulerName"] == "hami-scheduler"
    init = [c["name"] for c in pod["spec"].get("initContainers") or []]
    assert "block-cloud-metadata" not in init


async def test_hami_slice_drops_the_metadata_block_even_when_the_operator_keeps_it():
    """An operator whose own config turns `blockWithIptables` back on (after the overlay,
    or an older overlay): FracSpawner leaves the privileged init container out of HAMi pods
    only (z2jh's singleuser NetworkPolicy still blocks the metadata IP)."""
    keep = {"singleuser": {"cloudMetadata": {"blockWithIptables": True}}}
    values = merged_values(OVERLAY, keep)
    assert values["singleuser"]["cloudMetadata"]["blockWithIptables"] is True
    path = str(CATALOGS / "hami.yaml")
    c = hub_config(values, catalog_file=path)
    pod = await build_manifest(path, {"gpu": "1/2", "pool": "h100"}, admin=True, config=c)
    assert hami_webhook(pod)["allowed"]
    assert not [i for i in pod["spec"].get("initContainers") or [] if i["name"] == "block-cloud-metadata"]
    # a CPU server of the same hub keeps z2jh's user scheduler and the metadata block
    cpu = await build_manifest(path, {"gpu": "none"}, admin=True, config=c)
    assert cpu["spec"]["schedulerName"] == "jhub-user-scheduler"
    (block,) = cpu["spec"]["initContainers"]
    assert block["name"] == "block-cloud-metadata" and block["securityContext"]["privileged"]


def test_the_overlay_turns_the_iptables_metadata_block_off():
    """examples/z2jh/values.yaml says what to turn off: z2jh's NetworkPolicy
    (egressAllowRules.cloudMetadataServer: false, its default) already blocks the IP."""
    values = merged_values({}, OVERLAY)
    assert values["singleuser"]["cloudMetadata"]["blockWithIptables"] is False
    assert values["singleuser"]["networkPolicy"]["egressAllowRules"]["cloudMetadataServer"] is False
