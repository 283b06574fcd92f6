"""Where `make controlplane` (hack/build-controlplane.sh) leaves the control-plane binary."""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GO_MOD = REPO / "controlplane" / "go.mod"
#: a binary built elsewhere (another checkout's cache, a CI artefact) instead of the pinned one
ENV_BINARY = "FRACSPAWNER_CONTROLPLANE_BIN"


class BinaryMissing(RuntimeError):
    """The control plane is not built: the message says how to build it."""


def kubernetes_pin(go_mod: Path = GO_MOD) -> str:
    """The k8s.io/kubernetes version controlplane/go.mod requires (e.g. "v1.36.3")."""
    match = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v\S+)", go_mod.read_text(), re.M)
    if not match:
        raise BinaryMissing(f"{go_mod}: no k8s.io/kubernetes requirement")
    return match[1]


def find_binary() -> Path:
    """The built kube-controlplane, or BinaryMissing saying to run `make controlplane`."""
    override = os.environ.get(ENV_BINARY)
    if override:
        path = Path(override)
        if not os.access(path, os.X_OK):
            raise BinaryMissing(f"{ENV_BINARY}={override} is not an executable file")
        return path
    pin = kubernetes_pin()
    path = REPO / ".cache" / "controlplane" / pin / "kube-controlplane"
    if not os.access(path, os.X_OK):
        raise BinaryMissing(
            f"the control plane for k8s.io/kubernetes {pin} is not built ({path} is missing): "
            "run `make controlplane` (once per pin; it builds from Go modules)"
        )
    return path
