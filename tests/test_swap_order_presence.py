"""The culler's swap order is checked against the server's own presence (docs/culler.md, "Over-
commit and swap"): the culler leaves present users' kernels out, but by a report up to a report
interval old, and the person may have sat down since. The server took the order (`hibernate_now`)
on the culler's word: an idle kernel of a person at a visible tab, typing, was swapped out, and
their next cell waited for the copy and a restore on a GPU under pressure. Now it refuses it
as a refusal that may pass (`next_try`: the culler asks another kernel), and logs it once.

Through the real GpuMonitor, Presence and Hibernator on the fake checkpoint driver, read back by
the culler's own report parser.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from fracspawner.culler.pressure import swap_facts
from fracspawner.serverext.clients import CLIENT_ACTIVITY_KEY
from fracspawner.serverext.presence import SETTINGS_KEY, Presence, parse_client_report, utcnow
from tests.test_hibernation_copy_reported import as_sent, bob_s_server
from tests.test_hibernation_driver import (  # noqa: F401 (fixtures)
    fake,
    hibernator,
    sleeper,
)

ORDER = "swapped out: the GPU it shares with other notebooks was full"


def with_presence(monitor) -> Presence:
    presence = Presence(settings=monitor.settings)
    monitor.settings[SETTINGS_KEY] = presence
    return presence


def tab(presence: Presence, idle_seconds: float, visible: bool = True) -> None:
    body = {"client": "tab-1", "visible": visible, "focused": visible, "idle_seconds": idle_seconds}
    presence.record(*parse_client_report(body, utcnow()))


async def test_a_swap_order_for_a_present_person_s_kernel_is_refused(fake, sleeper, caplog):  # noqa: F811 (the fixtures)
    state, cgroup = fake
    monitor = bob_s_server(state, cgroup, sleeper.pid)
    monitor.hibernator = hibernator(cgroup, retry_refused_after=60)
    presence = with_presence(monitor)
    tab(presence, idle_seconds=5)  # bob is at his visible tab, typed 5 s ago
    caplog.set_level(logging.INFO)

    assert await monitor.hibernate_now("k", ORDER) == "running"
    assert await monitor.hibernate_now("k", ORDER) == "running"  # the culler said it again
    hib = monitor.hibernator
    assert hib.kernels["k"].state == "running" and hib.hibernations == []
    refusals = [r for r in caplog.records if "is at the server" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in refusals]

    # the report says why, and the culler reads it as a refusal: it asks another kernel
    sent = as_sent(monitor)
    (entry,) = sent["kernels"]
    assert entry["hibernation"]["reason"].startswith("not hibernated: its user is at the server")
    received = utcnow().timestamp()
    (gpu,) = swap_facts(sent, received).gpus
    (kernel,) = gpu.kernels
    assert kernel.refused and kernel.resident_mib > 0


async def test_in_session_is_not_present_the_order_is_taken(fake, sleeper):  # noqa: F811 (the fixtures)
    """The culler's own rule, checked again, no more: present is a tab visible and used within
    the presence timeout. A hidden tab (in session: idle kernels may hibernate, never shut
    down) and a script's request a moment ago (activity, which the order's "whatever its idle
    time" overrides) are not: the order is taken."""
    state, cgroup = fake
    monitor = bob_s_server(state, cgroup, sleeper.pid)
    presence = with_presence(monitor)
    tab(presence, idle_seconds=0, visible=False)
    monitor.settings[CLIENT_ACTIVITY_KEY] = utcnow() - timedelta(seconds=30)
    assert presence.in_session() and not presence.present()
    assert await monitor.hibernate_now("k", ORDER) == "hibernated"


async def test_a_person_away_is_swapped_out_as_ordered(fake, sleeper):  # noqa: F811 (the fixtures)
    """The other side: a visible tab untouched past the presence timeout is nobody at the
    server: the order is taken."""
    state, cgroup = fake
    monitor = bob_s_server(state, cgroup, sleeper.pid)
    presence = with_presence(monitor)
    tab(presence, idle_seconds=presence.timeout + 60)
    assert await monitor.hibernate_now("k", ORDER) == "hibernated"
    assert monitor.hibernator.kernels["k"].why == ORDER
