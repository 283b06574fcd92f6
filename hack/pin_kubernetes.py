#!/usr/bin/env python3
"""Pin controlplane/go.mod to one k8s.io/kubernetes release, staging modules included.

k8s.io/kubernetes' go.mod points each staging module (k8s.io/api, k8s.io/apiserver, ...) at
./staging/src/... with version v0.0.0, so a module importing it must `replace` every one of them
with the published release: v0.X.Y for Kubernetes v1.X.Y. This script reads that list from the
release's own go.mod (fetched through the Go module proxy by `go mod download`) instead of a hand
list, so a new pin is one command:  python3 hack/pin_kubernetes.py v1.36.3
(See also operator-framework/operator-controller hack/tools/k8smaintainer, which does the same.)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

MODULE_DIR = Path(__file__).resolve().parent.parent / "controlplane"


def staging_version(kube_version: str) -> str:
    """v1.36.3 -> v0.36.3 (the staging modules' tag for that Kubernetes release)."""
    match = re.fullmatch(r"v1\.(\d+)\.(\d+)", kube_version)
    if not match:
        raise SystemExit(f"pin_kubernetes: {kube_version!r} is not a release like v1.36.3")
    return f"v0.{match[1]}.{match[2]}"


def go_json(*args: str, cwd: Path | None = None) -> dict:
    out = subprocess.run(["go", *args], cwd=cwd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def staging_modules(kube_version: str) -> list[str]:
    """The module paths that k8s.io/kubernetes@version replaces with ./staging/src/..."""
    info = go_json("mod", "download", "-json", f"k8s.io/kubernetes@{kube_version}")
    if info.get("Error"):
        raise SystemExit(f"pin_kubernetes: {info['Error']}")
    edit = go_json("mod", "edit", "-json", info["GoMod"])
    return sorted(
        r["Old"]["Path"]
        for r in edit.get("Replace") or []
        if r["New"]["Path"].startswith("./staging/")
    )


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: pin_kubernetes.py v1.X.Y", file=sys.stderr)
        return 2
    kube_version = argv[1]
    staging = staging_version(kube_version)
    edits = [f"-require=k8s.io/kubernetes@{kube_version}"]
    edits += [f"-replace={m}={m}@{staging}" for m in staging_modules(kube_version)]
    subprocess.run(["go", "mod", "edit", *edits], cwd=MODULE_DIR, check=True)
    count = len(edits) - 1
    print(
        f"controlplane/go.mod: k8s.io/kubernetes {kube_version}, "
        f"{count} staging modules at {staging}"
    )
    print("now run: cd controlplane && go mod tidy")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
