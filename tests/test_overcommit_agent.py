"""The server's side of over-commit's swap (serverext/swap.py, reporter.py, hibernate.py): the
culler's answer names kernels to swap out and the server acts only on its own; a resume refused
for want of room on an over-committed GPU waits, says so once, and goes on as soon as there is
room; the reporter hands the culler's answer on and reports sooner when asked.
"""

from __future__ import annotations

import asyncio
import json
import os
from types import SimpleNamespace

from tornado import web
from tornado.httpserver import HTTPServer

from devcluster.localhub import free_port
from fracspawner.serverext.checkpoint import CheckpointError
from fracspawner.serverext.hibernate import GPU_FULL, Hibernator, KernelSleep
from fracspawner.serverext.reporter import GpuReporter
from fracspawner.serverext.swap import SwapAgent


class Driver:
    """A checkpoint driver whose restore is refused for want of room while `full` (the CUDA
    Driver API: cuCheckpointProcessRestore needs "enough memory" on the GPU), after which every
    restore answers CUDA_ERROR_OPERATING_SYSTEM (NVIDIA/cuda-checkpoint#44; the fake in
    tests/fake_nvml does the same)."""

    def __init__(self) -> None:
        self.full, self.states, self.restores, self.lost = True, {}, 0, False

    def check(self) -> None:
        pass

    def state(self, pid: int) -> str:
        return self.states.get(pid, "checkpointed")

    def restore(self, pid: int) -> None:
        self.restores += 1
        if self.lost:
            raise CheckpointError("cuCheckpointProcessRestore", "CUDA_ERROR_OPERATING_SYSTEM")
        if self.full:
            self.lost = True
            raise CheckpointError("cuCheckpointProcessRestore", "CUDA_ERROR_OUT_OF_MEMORY")
        self.states[pid] = "locked"

    def unlock(self, pid: int) -> None:
        self.states[pid] = "running"


class Monitor:
    """The parts of GpuMonitor the agent uses."""

    def __init__(self, hibernator: Hibernator, kernels: set[str]) -> None:
        self.hibernator, self.kernels, self.asked = hibernator, kernels, []
        device = SimpleNamespace(uuid="GPU-1", memory_total_mib=15360.0, memory_used_mib=15360.0)
        self.sample = SimpleNamespace(devices=[device])

    def current_sample(self):
        return self.sample

    def _kernel_ids(self) -> set[str]:
        return set(self.kernels)

    async def hibernate_now(self, kernel_id: str, reason: str) -> str:
        self.asked.append((kernel_id, reason))
        return "hibernated"


def hibernated(hib: Hibernator, kid: str) -> KernelSleep:
    s = KernelSleep(kid, state="hibernated", pid=os.getpid(), memory_mib=3840.0)
    hib.kernels[kid] = s
    return s


async def until(check, what: str, timeout: float = 30.0) -> None:
    """Wait for a condition; the bound only ends a failing test."""
    for _ in range(int(timeout / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def test_the_agent_swaps_out_only_its_own_kernels_and_reports_sooner(monkeypatch):
    monkeypatch.setenv("FRACSPAWNER_GPU_OVERCOMMIT", "2")
    hib = Hibernator(driver=Driver())
    monitor = Monitor(hib, {"k1", "k2"})
    soon: list[float] = []
    agent = SwapAgent(monitor, soon.append)
    assert hib.swap_managed
    agent.on_answer(
        {"swap": {"report_in": 5, "hibernate": [
            {"kernel_id": "k1", "reason": "swapped out: the GPU was full"},
            {"kernel_id": "someone-elses", "reason": "x"}, {"kernel_id": 7}, "junk"]}}
    )  # fmt: skip
    await until(lambda: 0.0 in soon, "a report after the swap")
    assert monitor.asked == [("k1", "swapped out: the GPU was full")]
    assert soon[0] == 5.0
    agent.on_answer({"swap": "nonsense"})
    agent.on_answer({"other": 1})
    assert monitor.asked == [("k1", "swapped out: the GPU was full")]


async def test_an_unhashable_kernel_id_drops_nothing_else_of_the_answer(monkeypatch):
    """The answer is the culler's, read with care: a kernel id that is a list or a mapping in a
    grant, a wait or host room raised TypeError (`in` a set) and the rest of that answer was
    lost, the hibernate orders and the grants after it included (review s53 finding 6); so was
    it where a list was a mapping. Now such an entry, or field, is skipped (each kernel's own
    orders are still taken only by the ids this server reported)."""
    monkeypatch.setenv("FRACSPAWNER_GPU_OVERCOMMIT", "2")
    hib = Hibernator(driver=Driver())
    monitor = Monitor(hib, {"k1", "k2"})
    agent = SwapAgent(monitor, lambda s: None)
    s = hibernated(hib, "k2")
    s.gpu_full = True  # its resume waits for room
    bad = [{"kernel_id": ["k1"], "gpu_memory_mib": 1.0}, {"kernel_id": {"k1": 1}}]
    agent.on_answer(
        {"swap": {"resume": [*bad, {"kernel_id": "k2", "gpu_memory_mib": 3840.0}],
                  "wait": bad, "host_room": bad, "host_wait": {"kernel_id": "k1"},
                  "hibernate": [*bad, {"kernel_id": "k1", "reason": "swapped out"}]}}
    )  # fmt: skip
    await until(lambda: monitor.asked, "the swap order taken")
    assert monitor.asked == [("k1", "swapped out")] and hib.granted(s) == 3840.0
    assert set(agent.host_room) == {"k1"} and agent.host_wait == {}


async def test_a_resume_on_a_full_gpu_waits_for_the_cullers_grant_and_says_so_once(
    monkeypatch,
):
    """Over-committed: no restore without the culler's grant (NVML read by each server at its
    own moment would let two restores into room for one, and a refused restore loses the state:
    NVIDIA/cuda-checkpoint#44). The culler hears of the demand at once; when its answer says the
    kernel waits, the cell is told once; its grant lets the restore go."""
    monkeypatch.setenv("FRACSPAWNER_GPU_OVERCOMMIT", "2")
    driver = Driver()
    hib = Hibernator(driver=driver, retry_first=3600.0, room_poll=3600.0)
    monitor = Monitor(hib, {"k1"})
    monitor.sample.devices[0].memory_used_mib = 0.0  # NVML shows room: not enough here
    hib.room_poll = 0.05
    soon: list[float] = []
    agent = SwapAgent(monitor, soon.append, room_check=0.05)
    told: list[str] = []
    hib.on_restore_failed.append(lambda kid, text: told.append(text))
    hibernated(hib, "k1")
    task = hib.resume("k1", "a message to the kernel")
    await until(lambda: hib.kernel_json("k1")["waiting_for_gpu"], "the resume waiting")
    assert driver.restores == 0 and 0.0 in soon and told == []
    (waiting,) = agent.extend({})["swap"]["waiting"]
    assert {k: waiting[k] for k in ("kernel_id", "gpu_memory_mib", "device")} == {
        "kernel_id": "k1", "gpu_memory_mib": 3840.0, "device": "GPU-1"
    }  # fmt: skip
    agent.on_answer({"swap": {"wait": [{"kernel_id": "k1"}], "report_in": 5}})
    agent.on_answer({"swap": {"wait": [{"kernel_id": "k1"}, {"kernel_id": "other"}]}})
    assert told == [GPU_FULL]
    # the culler grants room, but this pod's NVML (not virtualised) shows the GPU full: the
    # swap that makes the room has not landed, so the restore still waits
    monitor.sample.devices[0].memory_used_mib = 15360.0
    agent.on_answer({"swap": {"resume": [{"kernel_id": "k1", "gpu_memory_mib": 3840.0}]}})
    await asyncio.sleep(0.3)
    assert driver.restores == 0 and not task.done()
    # another kernel was swapped out: the reading shows the room, the restore goes on
    driver.full = False
    monitor.sample.devices[0].memory_used_mib = 15360.0 - 3840.0
    await asyncio.wait_for(task, 30)
    assert hib.kernels["k1"].state == "running" and told == [GPU_FULL]
    assert driver.restores == 1
    assert agent.extend({})["swap"]["waiting"] == []


async def test_without_over_commit_nvml_of_the_device_decides_and_says_so_at_once(monkeypatch):
    monkeypatch.delenv("FRACSPAWNER_GPU_OVERCOMMIT", raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    driver = Driver()
    hib = Hibernator(driver=driver, retry_first=0.05, room_poll=0.05)
    monitor = Monitor(hib, {"k1"})
    agent = SwapAgent(monitor, lambda s: None, room_check=0.05)
    assert not hib.swap_managed and agent.overcommit == 1 and agent.grant_only is None
    told: list[str] = []
    hib.on_restore_failed.append(lambda kid, text: told.append(text))
    hibernated(hib, "k1")
    task = hib.resume("k1", "a message")
    await until(lambda: told, "the notice")
    # nobody makes room here: no promise of a swap; no restore into the full GPU
    assert "no room on the GPU" in told[0] and GPU_FULL not in told and driver.restores == 0
    driver.full = False
    monitor.sample.devices[0].memory_used_mib = 15360.0 - 3840.0 - 1024.0
    await asyncio.wait_for(task, 30)
    assert driver.restores == 1 and hib.kernels["k1"].state == "running"


async def test_the_reporter_hands_the_cullers_answer_on():
    port = free_port()
    answers = iter([{"swap": {"report_in": 3}}, None])

    class Reports(web.RequestHandler):
        def post(self) -> None:
            body = next(answers)
            if body is None:
                self.set_status(204)
            else:
                self.finish(json.dumps(body))

    server = HTTPServer(web.Application([(r"/api/reports", Reports)]))
    server.listen(port, "127.0.0.1")
    try:
        got: list[dict] = []
        reporter = GpuReporter(
            report=lambda: {"available": False}, token="t", server_name="",
            culler_url=f"http://127.0.0.1:{port}/", report_interval=60.0,
        )  # fmt: skip
        reporter.on_answer = got.append
        assert await reporter.push_once()
        assert got == [{"swap": {"report_in": 3}}]
        reporter.report_soon(3.0)
        assert reporter.next_delay() == 3.0  # sooner, once
        assert reporter.next_delay() == 60.0
        assert await reporter.push_once() and got == [{"swap": {"report_in": 3}}]  # 204
    finally:
        server.stop()


async def test_a_refused_swap_asks_for_no_report_at_once():
    """Refused (a cell started meanwhile): the next regular report says so and the culler asks
    the next kernel; an immediate report would only bring the same order back, round and round."""
    hib = Hibernator(driver=Driver())
    monitor = Monitor(hib, {"k1"})

    async def refuse(kernel_id: str, reason: str) -> str:
        monitor.asked.append((kernel_id, reason))
        return "running"

    monitor.hibernate_now = refuse
    soon: list[float] = []
    agent = SwapAgent(monitor, soon.append)
    agent.on_answer({"swap": {"hibernate": [{"kernel_id": "k1", "reason": "swapped out"}]}})
    await until(lambda: monitor.asked, "the order taken")
    await asyncio.gather(*agent._tasks)
    assert soon == []


async def test_a_refused_restore_is_never_retried_straight_back_at_the_same_reading(monkeypatch):
    """NVML showed room and the driver refused anyway (a reading overtaken). On a driver without
    NVIDIA/cuda-checkpoint#44 the state is still there, but the reading that said room is stale:
    the next try waits for the backoff (an hour here), never hammers the driver."""
    monkeypatch.delenv("FRACSPAWNER_GPU_OVERCOMMIT", raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    driver = Driver()
    original = driver.restore

    def refuse(pid: int) -> None:
        driver.lost = False  # a driver that keeps the state restorable
        original(pid)

    driver.restore = refuse
    hib = Hibernator(driver=driver, retry_first=3600.0, room_poll=0.05)
    monitor = Monitor(hib, {"k1"})
    monitor.sample.devices[0].memory_used_mib = 0.0  # the stale reading: room
    SwapAgent(monitor, lambda s: None, room_check=0.05)
    told: list[str] = []
    hib.on_restore_failed.append(lambda kid, text: told.append(text))
    hibernated(hib, "k1")
    hib.resume("k1", "a message")
    await until(lambda: told, "the notice")
    await asyncio.sleep(0.5)
    assert driver.restores == 1 and "NVIDIA/cuda-checkpoint#44" in told[0]
    hib.forget("k1")
