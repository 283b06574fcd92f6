"""A pod's status written as the kubelet's status manager writes it
(pkg/kubelet/status/status_manager.go: syncPod on each change, syncBatch retrying what did not
get through): one write at a time, each computed when its turn comes, so the apiserver always
ends with the latest; a status equal to the one written is not sent again; a write that fails
(the apiserver timed out, a connection reset) is logged and tried again after a pause.

Without the one-at-a-time rule two containers' writes made at once (each in a thread of its own)
could arrive in either order: the later status landing first and the older one last left the
pod as the older one said (two app containers started together: the pod kept 'Pending' with
its second container waiting, although both ran)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

Status = dict[str, Any]
#: the first pause before a failed write is tried again, and the longest (syncBatch's 10 s)
RETRY = (1.0, 10.0)


def comparable(status: Status) -> Status:
    """The status without what changes at each computation (conditions' transition times)."""
    return {**status, "conditions": [{**c, "lastTransitionTime": ""}
                                     for c in status.get("conditions") or []]}  # fmt: skip


class StatusWriter:
    def __init__(
        self,
        compute: Callable[[], Status],
        write: Callable[[Status], Awaitable[bool]],
        written: Callable[[Status], None],
        failed: Callable[[BaseException], None],
        retry: tuple[float, float] = RETRY,
    ) -> None:
        """`compute`: the pod's status now; `write`: send it (False: the pod is gone);
        `written`: told each status that got through; `failed`: told each error."""
        self._compute, self._write, self._written_cb, self._failed_cb = (
            compute, write, written, failed,
        )  # fmt: skip
        self.retry = retry
        self._lock = asyncio.Lock()
        self._written: Status | None = None
        self._retrying: asyncio.Task | None = None
        #: whether the last write failed (it is being retried)
        self.failing = False
        self.failures = 0
        self.last_error: BaseException | None = None

    async def sync(self) -> None:
        """Write the latest status (after any write under way); on an error, retried later."""
        async with self._lock:
            status = self._compute()
            same = comparable(status)
            if same == self._written:
                self.failing = False
                return
            try:
                ok = await self._write(status)
            except Exception as err:  # the kubelet's status manager logs and retries
                self.failing, self.failures, self.last_error = True, self.failures + 1, err
                self._failed_cb(err)
                self._retry_later()
                return
            self.failing = False
            if ok:
                self._written = same
                self._written_cb(status)

    def _retry_later(self) -> None:
        if self._retrying is None or self._retrying.done():
            self._retrying = asyncio.get_running_loop().create_task(self._again())

    async def _again(self) -> None:
        pause, longest = self.retry
        while self.failing:
            await asyncio.sleep(pause)
            pause = min(pause * 2, longest)
            await self.sync()  # failing again: this task, still running, goes on

    def close(self) -> None:
        """No more retries (the pod's worker ends)."""
        if self._retrying is not None:
            self._retrying.cancel()
