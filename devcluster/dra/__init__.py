"""Dynamic Resource Allocation (`resource.k8s.io/v1`) in the devcluster: the API's kinds and
validation (kinds.py), the resourceclaim controller (controller.py), the scheduler's
structured-parameters allocator (allocator.py, CEL in cel.py) and NVIDIA's GPU kubelet plugin's
ResourceSlices (nvidia.py). See docs/devcluster.md, "Dynamic Resource Allocation"."""
