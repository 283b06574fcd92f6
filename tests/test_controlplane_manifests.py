"""The objects the control plane's launcher installs at every start (NVIDIA DeviceClasses, the
vendored Kubeflow CRDs) are read with libyaml's loader where PyYAML has it, for speed: they are
the objects PyYAML's pure-Python safe loader reads from the same files."""

from __future__ import annotations

import yaml

from devcluster.controlplane import launcher


def test_the_fast_loader_reads_the_same_objects_as_the_safe_loader():
    files = [launcher.MANIFESTS / "deviceclasses.yaml"]
    files += sorted((launcher.MANIFESTS / "crds").glob("*.yaml"))
    expected = [doc for f in files for doc in yaml.safe_load_all(f.read_text()) if doc]
    assert launcher._manifests() == expected
    kinds = [doc["kind"] for doc in expected]
    assert kinds.count("CustomResourceDefinition") == 5 and "DeviceClass" in kinds


def test_libyaml_is_used_where_pyyaml_has_it():
    assert launcher.SAFE_LOADER is getattr(yaml, "CSafeLoader", yaml.SafeLoader)
