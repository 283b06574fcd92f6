"""Real JupyterHub users and spawners without a running hub: JupyterHub's ORM in an in-memory
database and its `jupyterhub.user.User`, which builds FracSpawner objects the way the hub does
(`get_or_create_spawner` -> `_new_spawner` -> `load_state`). No cluster is contacted: the
kube config points at a closed port."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from jupyterhub import orm
from jupyterhub.objects import Hub, Server
from jupyterhub.user import User
from jupyterhub.utils import maybe_future
from sqlalchemy import inspect
from traitlets.config import Config

from fracspawner.cli.plan import _PLACEHOLDER_KUBECONFIG, use_kubeconfig
from fracspawner.hub.spawner import FracSpawner
from tests.conftest import DEMO_CATALOG


class HubUsers:
    """Users of one (in-memory) hub database, with FracSpawner configured by `config`."""

    def __init__(self, config: dict[str, Any] | None = None, *, live_capacity: bool = False):
        self.db = orm.new_session_factory("sqlite:///:memory:")()
        cfg = Config(config or {})
        if "catalog_file" not in cfg.FracSpawner and "catalog" not in cfg.FracSpawner:
            cfg.FracSpawner.catalog_file = str(DEMO_CATALOG)
        cfg.FracSpawner.live_capacity = live_capacity
        self.config = cfg
        self._tmp = tempfile.TemporaryDirectory()
        self.kubeconfig = Path(self._tmp.name) / "kubeconfig"
        self.kubeconfig.write_text(_PLACEHOLDER_KUBECONFIG)

    def settings(self) -> dict[str, Any]:
        return {
            "spawner_class": FracSpawner,
            "config": self.config,
            "hub": Hub(),
            "allow_named_servers": True,
        }

    def user(self, name: str, groups: tuple[str, ...] = (), admin: bool = False) -> User:
        """The hub's User object for `name` (created in the database on first use)."""
        orm_user = orm.User.find(self.db, name)
        if orm_user is None:
            orm_user = orm.User(name=name, admin=admin)
            self.db.add(orm_user)
            for group in groups:
                orm_group = orm.Group.find(self.db, group) or orm.Group(name=group)
                self.db.add(orm_group)
                orm_user.groups.append(orm_group)
            self.db.commit()
        return User(orm_user, settings=self.settings(), db=self.db)

    def spawner(self, user: User, server: str = "") -> FracSpawner:
        with use_kubeconfig(self.kubeconfig):
            return user.get_or_create_spawner(server, server)


async def begin_spawn(spawner: FracSpawner, options: dict[str, Any], auth_state: Any = None):
    """What JupyterHub's `User.spawn` does up to and including `start()`'s first step
    (jupyterhub/user.py: user_options set, clear_state(), the auth_state_hook, group overrides,
    the pre_spawn_hook; then kubespawner's `_start` calls load_user_options), and the pod it
    would create. Raises the 400 a refused spawn gets."""
    spawner._spawn_pending = True
    try:
        spawner.user_options = options
        spawner.clear_state()
        await spawner.run_auth_state_hook(auth_state)
        await spawner.apply_group_overrides()
        await maybe_future(spawner.run_pre_spawn_hook())
        await spawner.load_user_options()
    except BaseException:
        spawner.clear_state()  # User.spawn stops a spawn that failed
        raise
    finally:
        spawner._spawn_pending = False
    spawner.server = running_server(spawner)  # started: the server is now active
    return await spawner.get_pod_manifest()


def running_server(spawner: FracSpawner) -> Server:
    """A server record as JupyterHub keeps one for a started server."""
    orm_server = orm.Server(
        proto="http", ip="127.0.0.1", port=8888, base_url=f"/{spawner.name}/", cookie_name="c"
    )
    db = inspect(spawner.orm_spawner).session
    db.add(orm_server)
    db.commit()
    return Server(orm_server=orm_server)


def refusal(error: Exception) -> str:
    """The message of a refused spawn (a tornado HTTPError, message possibly in its args)."""
    message = getattr(error, "log_message", None) or str(error)
    args = getattr(error, "args", ())
    return message % args if args else message


def stop(spawner: FracSpawner) -> None:
    """What `User.stop` leaves behind: no server, state cleared."""
    spawner.server = None
    spawner.clear_state()
