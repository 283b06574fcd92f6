"""The demo's and the test hubs' own ports never land on the port their caller chose.

A test draws the demo's --port from its worker's block with free_port(); the demo, a child with
the same worker's block, then draws the culler's, the hub's, the proxy API's and the service's
ports from that block too, while nothing listens on --port yet. When the draws met, the hub
failed to bind and the demo ended before it served (CI at 90e9e64,
test_every_process_ends_on_a_signal_when_the_hub_is_killed_mid_clean_up[1])."""

from __future__ import annotations

import pytest

from devcluster import localhub


@pytest.fixture
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that has handed out no port yet (what the demo is when it starts)."""
    monkeypatch.setattr(localhub, "_handed_out", set())


def test_a_port_the_caller_chose_is_not_drawn_again(fresh_process: None, monkeypatch) -> None:
    chosen = localhub.free_port()  # the caller's draw, where the demo's first draw would land
    monkeypatch.setattr(localhub, "_handed_out", set())
    localhub.keep_port(chosen)  # what `fracspawner demo --port` and launch_hub(port=) do
    drawn = [localhub.free_port() for _ in range(4)]
    assert chosen not in drawn
    assert len(set(drawn)) == 4
