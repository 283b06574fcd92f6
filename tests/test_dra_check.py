"""Issue 30 item 5: `fracspawner check` validates DRA pools: every mistake with its path and a
did-you-mean (the schema's $defs.dra_options and the dra backend's own checks), and warnings
for settings that leave a gap (unlimited shares book nothing; CEL the counts cannot evaluate)."""

from __future__ import annotations

from tests.cli_helpers import check_catalog


def test_every_dra_mistake_is_named_with_its_path(tmp_path):
    out = check_catalog(
        tmp_path,
        {
            "pools": {
                "h100": {
                    "gpu": "H100-80GB",
                    "backend": "dra",
                    "options": {"sharing": "memroy", "shraing": "x"},
                    "offers": ["1/4"],
                },
                "a100": {
                    "gpu": "A100-80GB",
                    "backend": "dra",
                    "options": {"sharing": "memory"},
                    "offers": ["mig-1g.10gb"],
                },
                "t4": {
                    "gpu": "T4",
                    "backend": "dra",
                    "options": {"sharing": "memory", "mps": True},
                    "offers": ["1"],
                },
            }
        },
    )
    assert out.returncode != 0
    lines = (out.stdout + out.stderr).splitlines()
    assert "3 problems" in lines[0] or "4 problems" in lines[0], lines
    assert any(
        "pools.h100.options.sharing: 'memroy'" in line and "did you mean 'memory'" in line
        for line in lines
    )
    assert any("pools.h100.options.shraing" in line and "'sharing'" in line for line in lines)
    assert any("pools.a100.offers[0]: mig-1g.10gb: set options.mig" in line for line in lines)
    assert any("pools.t4: options.mps" in line and "consumable shares" in line for line in lines)


def test_a_clean_dra_catalog_passes_with_its_warnings(tmp_path):
    selector = "device.attributes['gpu.nvidia.com'].architecture == 'Ada'"
    out = check_catalog(
        tmp_path,
        {
            "pools": {
                "l4": {
                    "gpu": "L4",
                    "backend": "dra",
                    "options": {"sharing": "unlimited", "selectors": [selector]},
                    "offers": ["1/2"],
                }
            }
        },
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout + out.stderr
    assert "the catalog is fine" in text
    assert "pools.l4.options.sharing: with --consumable-shares=unlimited" in text
    assert "pools.l4.options.selectors" in text


def test_the_kubeflow_culler_sees_a_gpu_held_through_a_claim():
    """A notebook whose container uses a DRA claim (no extended resource, no fracspawner
    labels: a tenant's own template) holds a GPU as the culler counts servers."""
    from fracspawner.culler.kubeflow import gpu_of

    pod = {
        "metadata": {},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "mine"}],
            "containers": [{"name": "nb", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }
    assert gpu_of(pod) == ("gpu", None)
