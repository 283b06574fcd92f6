"""Issue 34 item 7: a DRA pool whose claims carry a TimeSlicing or MPS GpuConfig needs the NVIDIA
DRA driver's alpha feature gates `TimeSlicingSettings` / `MPSSupport` (both default off:
kubernetes-sigs/dra-driver-nvidia-gpu pkg/featuregates/featuregates.go). Without them the driver
refuses the config when it prepares the claim on the node (api/nvidia.com/resource/v1beta1/
validate.go: "%q is selected as the GPU sharing strategy, but the %q feature gate is not
enabled", from NodePrepareResources), so the pod stays in ContainerCreating. `fracspawner check`
says so, naming the pool, the gate and the driver's Helm value (`featureGates`, values.yaml)."""

from __future__ import annotations

from tests.cli_helpers import check_catalog


def test_check_warns_that_time_slicing_and_mps_pools_need_the_drivers_gates(tmp_path):
    out = check_catalog(
        tmp_path,
        {
            "pools": {
                "t4-ts": {
                    "gpu": "T4",
                    "backend": "dra",
                    "options": {"time_slicing": "Short"},
                    "offers": ["1"],
                },
                "l4-mps": {
                    "gpu": "L4",
                    "backend": "dra",
                    "options": {"mps": True},
                    "offers": ["1"],
                },
                "h100": {
                    "gpu": "H100-80GB",
                    "backend": "dra",
                    "options": {"sharing": "memory"},
                    "offers": ["1/2"],
                },
            }
        },
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "the catalog is fine, with 2 warnings" in text, text
    lines = text.splitlines()
    (ts,) = [line for line in lines if "pools.t4-ts.options.time_slicing" in line]
    assert "TimeSlicingSettings" in ts and "featureGates" in ts and "ContainerCreating" in ts
    (mps,) = [line for line in lines if "pools.l4-mps.options.mps" in line]
    assert "MPSSupport" in mps and "featureGates" in mps
    assert not [line for line in lines if "pools.h100" in line]
