"""A pytest plugin for kubespawner's own tests, loaded by hack/kubespawner_tests.py.

- KUBESPAWNER_TESTS_CLUSTER_ONLY=1 keeps only the tests that reach a cluster (those whose
  fixtures include kubespawner's `kube_client`): the count issue 35 states (20 at 7.1.0).
- JupyterHub 6's HTTP client wants a running event loop when it is made, which kubespawner
  7.1.0's (synchronous, session-scoped) `ssl_app` fixture does not have when it calls
  `JupyterHub.init_internal_ssl()` to make the internal-SSL certificates: outside a loop the
  client is made without one (it is not used there). A shim for the JupyterHub installed here,
  not a change to what the tests check.
- KUBESPAWNER_TESTS_SPAWNER=fracspawner makes `kubespawner.KubeSpawner` FracSpawner before the
  test modules import it, so every `KubeSpawner(...)` they build is a FracSpawner (configured as
  they configure KubeSpawner: FracSpawner is a subclass, so `c.KubeSpawner.*` applies).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from jupyterhub import httpclient

_made = httpclient.JupyterHubHTTPClient.__init__


def _made_anywhere(self: Any, **kwargs: Any) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the ssl_app fixture: certificates only, no requests
        super(httpclient.JupyterHubHTTPClient, self).__init__(**kwargs)
        return
    _made(self, **kwargs)


httpclient.JupyterHubHTTPClient.__init__ = _made_anywhere  # type: ignore[method-assign]

if os.environ.get("KUBESPAWNER_TESTS_SPAWNER") == "fracspawner":
    import kubespawner

    from fracspawner.hub.spawner import FracSpawner

    kubespawner.KubeSpawner = FracSpawner  # type: ignore[misc]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("KUBESPAWNER_TESTS_CLUSTER_ONLY") != "1":
        return
    keep = [i for i in items if "kube_client" in getattr(i, "fixturenames", ())]
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = keep
