"""The catalog matching `devcluster.topology.generate_large`'s node kinds."""

from __future__ import annotations

from typing import Any


def catalog_for_large_topology() -> dict[str, Any]:
    return {
        "pools": {
            "a100-mig": {
                "display_name": "A100 80GB (MIG)",
                "gpu": "A100-80GB",
                "backend": "mig-mixed",
                "node_selector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
                "offers": ["mig-1g.10gb", "mig-2g.20gb", "mig-3g.40gb"],
            },
            "h100": {
                "display_name": "H100 80GB (HAMi)",
                "gpu": "H100-80GB",
                "backend": "hami",
                "node_selector": {"gpu": "on"},
                "offers": ["1/8", "1/4", "1/2", "10GiB", "20GiB", "1"],
            },
            "t4": {
                "display_name": "T4 16GB (time-sliced)",
                "gpu": "T4",
                "backend": "timeslicing",
                "replicas": 4,
                "node_selector": {"nvidia.com/gpu.product": "Tesla-T4-SHARED"},
                "offers": ["1/4"],
            },
        },
        "images": {
            "pytorch": {
                "display_name": "PyTorch",
                "image": "quay.io/jupyter/pytorch-notebook:cuda12-latest",
                "default": True,
            }
        },
        "access": {"default": {"pools": "all", "max_gpu": 2}},
    }
