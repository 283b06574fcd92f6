"""NVIDIA's GPU DRA kubelet plugin's devices (nvidia.py), which the node agent publishes as
ResourceSlices (devcluster/nodeagent/slices.py). See docs/devcluster.md, "A DRA node in a
topology"."""
