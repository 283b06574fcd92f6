"""A model of how Docker builds a Dockerfile, for the rules that decide who owns what.

No container engine runs here (no Docker daemon, no BuildKit), so tests/test_notebook_image.py
"builds" images/notebook/Dockerfile with this model instead. It stands for Docker's documented
rules (Dockerfile reference, https://docs.docker.com/reference/dockerfile/):

- `ARG` before the first `FROM` is in scope for `FROM` lines only; inside a stage `ARG NAME`
  (no value) takes that global default ("Understand how ARG and FROM interact").
- `FROM` starts a stage with the base image's user, environment, working directory and files.
  Each stage's starting state comes from `BASE_IMAGES` below (what those images' own Dockerfiles
  leave behind); an image it does not know is an error, never a guess.
- `USER` sets the user "for the remainder of the current stage ... for any RUN, ENTRYPOINT and
  CMD instructions that follow it" (#user).
- `COPY`/`ADD`: "By default, both COPY and ADD create files and directories owned by UID and GID
  0 unless the optional --chown flag specifies a given username, groupname, or UID/GID
  combination" (#copy---chown---chmod) -- whatever `USER` is in force. Missing parent
  directories are created, root-owned.
- `WORKDIR` sets the directory for RUN/COPY relative paths, creating it if missing (#workdir).
- `ENV` values are in the environment of later instructions and expanded in them (#env).
- `RUN` runs its shell command as the `USER` in force (#user, #run).

`RUN` commands are not executed: each command the Dockerfile uses is modelled by the file
system effects that need permission (create a file, create a directory, read a file, install
into an environment, delete), checked with POSIX rules for a process of that uid and groups:
write+search on a directory to add or remove an entry, and with the sticky bit (`/tmp`,
mode 1777) only the entry's owner or the directory's owner may remove it
(https://pubs.opengroup.org/onlinepubs/9799919799/functions/unlink.html, "EACCES"/"EPERM"; rm -r
must empty a directory first, so it needs write on it too). A command the model does not know
is an error: teach the model rather than let it pass silently.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
import shlex
from dataclasses import dataclass, field


class BuildError(Exception):
    """The build fails, as `docker build` would (the message says at which instruction)."""


class ModelError(Exception):
    """The Dockerfile uses something this model does not know: extend the model."""


@dataclass
class Node:
    uid: int
    gid: int
    mode: int  # permission bits, with 0o1000 the sticky bit
    is_dir: bool


@dataclass(frozen=True)
class Base:
    """What a base image's own Dockerfile leaves for the next one."""

    user: str
    env: dict[str, str]
    workdir: str
    dirs: dict[str, tuple[int, int, int]]  # path: uid, gid, mode
    #: where `pip install` writes (the environment the image's python is in)
    site: str
    #: supplementary groups of the users the image defines (/etc/group)
    groups: dict[int, tuple[int, ...]] = field(default_factory=dict)
    names: dict[str, int] = field(default_factory=dict)  # /etc/passwd and /etc/group names
    files: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # path: uid, gid, mode


_DEBIAN = {"/": (0, 0, 0o755), "/tmp": (0, 0, 0o1777), "/usr/local": (0, 0, 0o755)}
_DEBIAN_DIRS = {**_DEBIAN, "/usr/local/bin": (0, 0, 0o755), "/usr/local/lib": (0, 0, 0o755)}

#: Jupyter Docker Stacks (jupyter/docker-stacks, images/docker-stacks-foundation/Dockerfile):
#: creates jovyan (NB_UID 1000, group users NB_GID 100), chowns CONDA_DIR=/opt/conda and
#: /home/jovyan to it (fix-permissions: group-writable, setgid dirs), ends with
#: `USER ${NB_UID}`; base-notebook's Dockerfile sets `WORKDIR "${HOME}"`, again ends with
#: `USER ${NB_UID}`, and so do scipy-notebook and pytorch-notebook (cuda12/cuda13 variants)
#: built on it.
DOCKER_STACKS = Base(
    user="1000",
    env={
        "NB_USER": "jovyan",
        "NB_UID": "1000",
        "NB_GID": "100",
        "CONDA_DIR": "/opt/conda",
        "HOME": "/home/jovyan",
        "PATH": "/opt/conda/bin:/usr/local/bin:/usr/bin:/bin",
    },  # fmt: skip
    workdir="/home/jovyan",
    dirs={
        **_DEBIAN,
        "/opt": (0, 0, 0o755),
        "/opt/conda": (1000, 100, 0o2775),
        "/home": (0, 0, 0o755),
        "/home/jovyan": (1000, 100, 0o2775),
    },  # fmt: skip
    site="/opt/conda",
    groups={1000: (100,)},
    names={"jovyan": 1000, "users": 100, "root": 0},
)
#: Docker's official python and node images: root, Debian, packages under /usr/local
PYTHON_SLIM = Base(
    user="root", env={"PATH": "/usr/local/bin:/usr/bin:/bin"}, workdir="/",
    dirs=_DEBIAN_DIRS, site="/usr/local", names={"root": 0},
)  # fmt: skip
NODE_SLIM = Base(
    user="root", env={"PATH": "/usr/local/bin:/usr/bin:/bin"}, workdir="/",
    dirs={
        **_DEBIAN_DIRS, "/usr/local/lib/node_modules": (0, 0, 0o755),
        "/usr/local/lib/node_modules/npm": (0, 0, 0o755),
    },
    files={"/usr/local/bin/node": (0, 0, 0o755)},
    site="/usr/local", names={"root": 0},
)  # fmt: skip
#: image reference patterns (fnmatch) -> the state they start a stage in
BASE_IMAGES: dict[str, Base] = {
    "quay.io/jupyter/*-notebook:*": DOCKER_STACKS,
    "python:*-slim*": PYTHON_SLIM,
    "node:*-slim": NODE_SLIM,
}


@dataclass
class Stage:
    name: str
    base: Base
    user: str
    env: dict[str, str]
    args: dict[str, str]
    workdir: str
    fs: dict[str, Node]
    #: (user, command) for each RUN: what the image's steps ran as
    runs: list[tuple[str, str]] = field(default_factory=list)

    def ids(self) -> tuple[int, tuple[int, ...]]:
        """uid and group ids of the USER in force (USER uid[:gid])."""
        user, _, group = self.user.partition(":")
        uid = self.base.names[user] if user in self.base.names else _number(user, "USER")
        if group:
            return uid, (_number(group, "USER group"),)
        return uid, (0,) if uid == 0 else self.base.groups.get(uid, (uid,))


def _number(text: str, what: str) -> int:
    if not text.isdigit():
        raise ModelError(f"{what} {text!r}: the model knows numeric ids and the base's names")
    return int(text)


def instructions(text: str) -> list[tuple[str, str, int]]:
    """(INSTRUCTION, arguments, line) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str, int]] = []
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction is dropped
        start = start or number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = pending + stripped
        pending = ""
        keyword, _, rest = whole.partition(" ")
        out.append((keyword.upper(), rest.strip(), start))
        start = 0
    return out


def _expand(text: str, values: dict[str, str]) -> str:
    def one(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        return values.get(name, "")

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, text)


def build(text: str, context: frozenset[str] = frozenset()) -> Stage:
    """Build every stage; the last one (the image) is returned. `context` names the files the
    build context offers COPY (relative paths); anything else COPY names is missing."""
    global_args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    stage: Stage | None = None
    for keyword, rest, line in instructions(text):
        where = f"line {line}: {keyword} {rest}"
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            if stage is None:
                global_args[name] = default
            else:
                stage.args[name] = default or global_args.get(name, "")
        elif keyword == "FROM":
            words = _expand(rest, global_args).split()
            ref = words[0]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            if ref in stages:
                parent = stages[ref]
                base = parent.base
                fs = {p: Node(**vars(n)) for p, n in parent.fs.items()}
                user, env, workdir = parent.user, dict(parent.env), parent.workdir
            else:
                known = (b for pattern, b in BASE_IMAGES.items() if fnmatch.fnmatch(ref, pattern))
                base = next(known, None)
                if base is None:
                    raise ModelError(f"{where}: the model does not know the image {ref}")
                fs = {p: Node(u, g, m, True) for p, (u, g, m) in base.dirs.items()}
                fs.update({p: Node(u, g, m, False) for p, (u, g, m) in base.files.items()})
                user, env, workdir = base.user, dict(base.env), base.workdir
            stage = Stage(name, base, user, env, {}, workdir, fs)
            stages[name] = stage
        elif stage is None:
            raise BuildError(f"{where}: no FROM before it")
        elif keyword == "USER":
            stage.user = _expand(rest, {**stage.env, **stage.args})
        elif keyword == "ENV":
            for key, value in re.findall(r'(\w+)=("[^"]*"|\S+)', rest):
                stage.env[key] = _expand(value.strip('"'), {**stage.env, **stage.args})
        elif keyword == "WORKDIR":
            path = posixpath.join(stage.workdir, _expand(rest, {**stage.env, **stage.args}))
            if path not in stage.fs:
                if stage.ids()[0] != 0:
                    raise ModelError(f"{where}: WORKDIR creating a folder as non-root")
                _mkdirs(stage, path, 0, 0)
            stage.workdir = path
        elif keyword in ("COPY", "ADD"):
            _copy(stage, stages, rest, context, where)
        elif keyword == "RUN":
            command = _expand(rest, {**stage.env, **stage.args})
            stage.runs.append((stage.user, command))
            _run(stage, command, where)
        elif keyword in ("LABEL", "SHELL", "EXPOSE", "CMD", "ENTRYPOINT"):
            continue  # nothing here changes who owns what
        else:
            raise ModelError(f"{where}: the model does not know {keyword}")
    if stage is None:
        raise BuildError("no FROM")
    return stage


def _copy(stage: Stage, stages: dict[str, Stage], rest: str, context: frozenset[str], where: str):
    words = shlex.split(_expand(rest, {**stage.env, **stage.args}))
    flags = {w.split("=", 1)[0]: w.split("=", 1)[1] for w in words if w.startswith("--")}
    paths = [w for w in words if not w.startswith("--")]
    *sources, dest = paths
    unknown = set(flags) - {"--from", "--chown"}
    if unknown:
        raise ModelError(f"{where}: the model does not know {sorted(unknown)}")
    uid, gid = 0, 0  # root, whatever USER says (#copy---chown---chmod)
    if "--chown" in flags:
        user, _, group = flags["--chown"].partition(":")
        names = stage.base.names
        uid = names[user] if user in names else _number(user, "--chown user")
        gid = uid
        if group:
            gid = names[group] if group in names else _number(group, "--chown group")
    dest = posixpath.normpath(posixpath.join(stage.workdir, dest))
    if "--from" in flags:
        origin = stages.get(flags["--from"])
        if origin is None:
            raise ModelError(f"{where}: --from={flags['--from']} is not a stage of this file")
        (source,) = sources
        source = posixpath.normpath(source)
        tree = {p: n for p, n in origin.fs.items() if p == source or p.startswith(source + "/")}
        if not tree:
            raise BuildError(f"{where}: {source} not found in stage {origin.name}")
        _mkdirs(stage, posixpath.dirname(dest), 0, 0)
        for path, node in sorted(tree.items()):
            target = dest + path[len(source) :]
            stage.fs[target] = Node(uid, gid, node.mode & 0o7777, node.is_dir)
        return
    for source in sources:
        wanted = source.rstrip("/")
        if not any(c == wanted or c.startswith(wanted + "/") for c in context):
            raise BuildError(f"{where}: {source} is not in the build context")
    target_dir = dest if dest.endswith("/") or len(sources) > 1 or dest == stage.workdir else None
    _mkdirs(stage, target_dir or posixpath.dirname(dest), 0, 0)
    for source in sources:
        path = posixpath.join(target_dir, posixpath.basename(source)) if target_dir else dest
        stage.fs[path] = Node(uid, gid, 0o644, False)


def _mkdirs(stage: Stage, path: str, uid: int, gid: int) -> None:
    parts = posixpath.normpath(path).split("/")
    for i in range(1, len(parts) + 1):
        here = "/".join(parts[:i]) or "/"
        stage.fs.setdefault(here, Node(uid, gid, 0o755, True))


# --- RUN: the commands' effects, with POSIX permission checks --------------------------------


def _may(stage: Stage, node: Node, want: int) -> bool:
    """access(2) for the USER in force: want is a mask of 4 (read), 2 (write), 1 (search)."""
    uid, groups = stage.ids()
    if uid == 0:
        return True
    if node.uid == uid:
        bits = (node.mode >> 6) & 7
    elif node.gid in groups:
        bits = (node.mode >> 3) & 7
    else:
        bits = node.mode & 7
    return bits & want == want


def _denied(what: str, path: str) -> BuildError:
    return BuildError(f"{what} '{path}': Permission denied")


def _reach(stage: Stage, path: str, what: str) -> None:
    """Every folder above `path` must be searchable."""
    parent = posixpath.dirname(path)
    while True:
        node = stage.fs.get(parent)
        if node is not None and not _may(stage, node, 1):
            raise _denied(what, path)
        if parent == "/":
            return
        parent = posixpath.dirname(parent)


def _create(stage: Stage, path: str, is_dir: bool, what: str) -> None:
    path = posixpath.normpath(posixpath.join(stage.workdir, path))
    _reach(stage, path, what)
    existing = stage.fs.get(path)
    if existing is not None:
        if is_dir and existing.is_dir:
            return
        if not existing.is_dir and not _may(stage, existing, 2):
            raise _denied(what, path)
        return  # an existing file is truncated: its owner stays
    parent = stage.fs.get(posixpath.dirname(path))
    if parent is None or not parent.is_dir:
        raise BuildError(f"{what} '{path}': No such file or directory")
    if not _may(stage, parent, 3):
        raise _denied(what, path)
    uid, groups = stage.ids()
    # setgid folders (fix-permissions) hand their group on
    gid = parent.gid if parent.mode & 0o2000 else groups[0]
    stage.fs[path] = Node(uid, gid, (0o755 if is_dir else 0o644) | (parent.mode & 0o2000), is_dir)


def _read(stage: Stage, path: str, what: str) -> None:
    path = posixpath.normpath(posixpath.join(stage.workdir, path))
    node = stage.fs.get(path)
    if node is None:
        raise BuildError(f"{what} '{path}': No such file or directory")
    _reach(stage, path, what)
    if not _may(stage, node, 4):
        raise _denied(what, path)


def _remove(stage: Stage, path: str) -> None:
    """rm -rf: empty a folder (needs read, write, search on it), then unlink it from its
    parent (write and search there; sticky: only the entry's or the folder's owner)."""
    path = posixpath.normpath(posixpath.join(stage.workdir, path))
    node = stage.fs.get(path)
    if node is None:
        return  # -f: nothing to do
    _reach(stage, path, "rm: cannot remove")
    if node.is_dir:
        children = [p for p in stage.fs if posixpath.dirname(p) == path and p != path]
        if children and not _may(stage, node, 7):
            raise _denied("rm: cannot remove", sorted(children)[0])
        for child in children:
            _remove(stage, child)
    parent = stage.fs[posixpath.dirname(path)]
    uid, _ = stage.ids()
    if not _may(stage, parent, 3):
        raise _denied("rm: cannot remove", path)
    if parent.mode & 0o1000 and uid not in (0, node.uid, parent.uid):
        raise BuildError(f"rm: cannot remove '{path}': Operation not permitted")
    del stage.fs[path]


def _glob(stage: Stage, pattern: str) -> list[str]:
    pattern = posixpath.normpath(posixpath.join(stage.workdir, pattern))
    return sorted(p for p in stage.fs if fnmatch.fnmatch(p, pattern))


def _run(stage: Stage, command: str, where: str) -> None:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|><")
    lexer.whitespace_split = True
    tokens = list(lexer)
    try:
        for simple in _and_list(tokens):
            _simple(stage, simple)
    except BuildError as e:
        raise BuildError(f"{where}\n  as USER {stage.user}: {e}") from None


def _and_list(tokens: list[str]) -> list[list[str]]:
    out, current = [], []
    for token in tokens:
        if token == "&&":
            out.append(current)
            current = []
        else:
            current.append(token)
    out.append(current)
    for simple in out:
        if simple[0] != "for" and any(t in ("||", "|", ";", "&") for t in simple):
            raise ModelError(f"the model only knows `a && b && c` command lists: {simple}")
    return out


def _redirect(stage: Stage, words: list[str]) -> list[str]:
    """`... > file`: the shell creates (or truncates) the file before the command runs."""
    if ">" in words:
        at = words.index(">")
        _create(stage, words[at + 1], False, "sh: cannot create")
        return words[:at] + words[at + 2 :]
    return words


def _option(words: list[str], *names: str) -> list[str]:
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w in names]


def _simple(stage: Stage, words: list[str]) -> None:
    if words[0] == "for":
        # for VAR in GLOB...; do echo ...; done [> file]
        done = words.index("done")
        body = words[words.index("do") + 1 : done]
        if any(w in ("rm", "mv", "cp", "mkdir", "chown", "chmod") for w in body):
            raise ModelError(f"the model does not know this loop's body: {body}")
        _redirect(stage, words[done:])
        return
    words = _redirect(stage, words)
    program = words[0]
    if program == "pip" and words[1] == "list":
        return
    if program == "pip" and words[1] == "wheel":
        out = _option(words, "--wheel-dir", "-w")[0]
        _create(stage, out, True, "pip wheel: could not create")
        _create(stage, posixpath.join(out, "fracspawner-0-py3-none-any.whl"), False, "pip wheel")
        return
    if program == "pip" and words[1] == "install":
        for path in _option(words, "--constraint", "-c", "--requirement", "-r"):
            _read(stage, path, "pip: could not open requirements file")
        # the wheel a requirements file names sits beside it (file://...)
        for path in _option(words, "--requirement", "-r"):
            for wheel in _glob(stage, posixpath.join(posixpath.dirname(path), "*.whl")):
                _read(stage, wheel, "pip: could not read")
        site = stage.base.site
        installed = posixpath.join(site, ".fracspawner-installed")
        _create(stage, installed, False, "pip: could not install")
        return
    if program == "rm":
        flags = [w for w in words[1:] if w.startswith("-")]
        if flags not in (["-rf"], ["-fr"], ["-f"]):
            raise ModelError(f"the model knows rm -rf / rm -f: {words}")
        for path in words[1:]:
            if not path.startswith("-"):
                _remove(stage, path)
        return
    if program == "ln" and words[1] == "-s":
        _create(stage, words[3], False, "ln: failed to create symbolic link")
        return
    raise ModelError(f"the model does not know the command {program!r} ({' '.join(words)})")
