"""Kubeflow Notebooks from the same catalog: `fracspawner kubeflow export` (PodDefaults, a
spawner_ui_config fragment, a WorkspaceKind patch, the MutatingWebhookConfiguration) and
`fracspawner webhook` (the admission webhook that gives a labelled pod its slice).

Facts about Kubeflow are in docs/kubeflow.md with their sources. This package may import
model, k8s, backends, capacity and choice; never hub or the devcluster (tests/test_layout.py).
"""
