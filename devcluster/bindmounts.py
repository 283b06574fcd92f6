"""Volumes at their mountPaths, as a container runtime puts them (bind mounts into the
container's own mount namespace), for the node agent's run mode (issue 35 item 2).

A pod's process shares the host's root filesystem, so a mountPath may not exist there
(/etc/jupyterhub/secret): the top-most missing directory on its way is made on the host, once,
as an empty mount point (a container runtime makes it in the image's root filesystem), and inside
the container's mount namespace a directory of the container's own is bound over it, so what the
container writes there (kubespawner's hub extracting its certificates beside its config) stays
its own. That directory is the container's rootfs: emptied at each of its starts (a new
container starts from a fresh layer), never at a sibling's, whose rootfs is another. The pod
records the mount points it made, so a later start (a sibling's, a restart) binds its own
directory over them again though the host has them by then. Then each volume (or its subPath,
a file or a directory) is bound at its mountPath. The mounts are private to the container's
namespace (`unshare --mount` makes propagation private): the host and other pods do not see
them. What the host keeps are those empty mount points."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

#: run inside the pod's mount namespace before its command: `sh -c SCRIPT KIND SRC DST ... --
#: COMMAND...` (KIND: private, dir or file)
SCRIPT = (
    'while [ "$1" != "--" ]; do '
    'kind="$1"; src="$2"; dst="$3"; shift 3; '
    'if [ "$kind" = file ]; then mkdir -p "$(dirname "$dst")"; [ -e "$dst" ] || : > "$dst"; '
    'else mkdir -p "$dst"; fi; '
    'mount --bind "$src" "$dst" || { echo "bindmounts: cannot bind $src at $dst" >&2; exit 125; }; '
    'done; shift; exec "$@"'
)


def _top_missing(path: Path) -> Path | None:
    """The top-most ancestor of `path` (itself included) that does not exist on the host."""
    missing = None
    for candidate in [path, *path.parents]:
        if candidate.exists() or candidate.is_symlink():
            break
        missing = candidate
    return missing


def _made(record: Path) -> list[Path]:
    """The mount points the pod's containers made on the host (`record`: one a line)."""
    try:
        return [Path(line) for line in record.read_text().splitlines() if line]
    except FileNotFoundError:
        return []


def plan(mounts: Mapping[str, str], private_root: Path, record: Path) -> list[str]:
    """The arguments for SCRIPT (without the command) binding each mountPath -> place (a path
    whose real path is the volume's), making the host's missing mount points. `private_root`:
    the container's own directories bound over those mount points (emptied first: a new
    container starts from a fresh layer; a sibling's are under another root). `record`: the
    pod's list of the mount points its containers made (a later start finds them on the host,
    yet binds its own directory over them)."""
    if private_root.exists():
        shutil.rmtree(private_root)
    made = _made(record)
    args: list[str] = []
    covered: list[Path] = []
    for mount_path in sorted(mounts, key=lambda p: (p.count("/"), p)):
        target = Path(mount_path)
        source = Path(os.path.realpath(mounts[mount_path]))
        ours = [m for m in made if target.is_relative_to(m)]
        top = min(ours, key=lambda m: len(m.parts)) if ours else _top_missing(target)
        if top is not None and not any(top.is_relative_to(c) for c in covered):
            if top == target and source.is_file():
                top.touch()  # a file's mount point
            else:
                top.mkdir(parents=True, exist_ok=True)
                if top not in made:
                    made.append(top)
                    record.parent.mkdir(parents=True, exist_ok=True)
                    with record.open("a") as out:
                        out.write(f"{top}\n")
                own = private_root / str(top).lstrip("/")
                own.mkdir(parents=True, exist_ok=True)
                args += ["dir", str(own), str(top)]
                covered.append(top)
        args += ["file" if source.is_file() else "dir", str(source), str(target)]
    return args


def argv(mounts: Mapping[str, str], private_root: Path, record: Path) -> list[str]:
    """The argv prefix binding the volumes, then running what follows it (`private_root`,
    `record`: plan's)."""
    if not mounts:
        return []
    return ["sh", "-c", SCRIPT, "bindmounts", *plan(mounts, private_root, record), "--"]
