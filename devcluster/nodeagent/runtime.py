"""The node agent's "run" mode: a bound pod's first container runs as a local process, by the
Python devcluster's own runner (devcluster.kubelet.Kubelet: the command from the pod's
command/args, env as the kubelet builds it from env/envFrom/fieldRef/secrets/config maps, the
pod's volumes, its own mount and UTS namespaces where root, a loopback pod IP). Kubelet is
asyncio code; here it runs on an event loop of its own thread, and the node threads call it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devcluster.kubelet import Kubelet, Lookup

#: what Kubelet.start raises for a container that cannot start: ConfigError (a missing secret,
#: config map or key), volumes.MountError, "executable file not found" (all RuntimeErrors)
START_ERRORS = (RuntimeError,)


class ProcessRuntime:
    def __init__(self, state_dir: Path, images: Mapping[str, list[str]] | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="nodeagent-runtime", daemon=True
        )
        self._thread.start()
        self.kubelet = Kubelet(Path(state_dir), images)
        self._lock = threading.Lock()

    def _call(self, coro: Any, timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self, pod: Mapping[str, Any], lookup: Lookup, env: Mapping[str, str]) -> str:
        """Start the pod's first container; its pod IP. START_ERRORS when it cannot start."""
        with self._lock:
            running = self._call(self.kubelet.start(pod, lookup, dict(env)), timeout=60)
        return running.ip

    def exit_code(self, namespace: str, name: str) -> int | None:
        """The container's exit status once it has exited, else None."""
        running = self.kubelet.running.get((namespace, name))
        return None if running is None else running.process.returncode

    def stop(self, namespace: str, name: str, grace: float) -> None:
        with self._lock:
            self._call(self.kubelet.stop(namespace, name, grace), timeout=grace + 30)

    def close(self) -> None:
        """Kill every pod's processes and end the loop."""
        self._loop.call_soon_threadsafe(self.kubelet.kill_all)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
