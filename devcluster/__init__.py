"""devcluster: fracspawner's test harness around a real Kubernetes control plane.

The launcher of kube-apiserver, etcd, kube-scheduler and kube-controller-manager built from
k8s.io/kubernetes (`controlplane/`), the node agent that registers a topology's simulated GPU
nodes and runs their pods as local processes in place of the kubelet (`nodeagent/`), topology
files, `fracspawner devcluster`, and the demo's glue. Not in the wheel: the product never
imports it (docs/devcluster.md).
"""
