"""A missing outside tool skips a test on a developer's machine and fails it in CI."""

from __future__ import annotations

import pytest

from tests.missing import missing


def test_a_missing_tool_skips_outside_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="chromium not installed"):
        missing("chromium not installed")


def test_a_missing_tool_fails_in_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI: prometheus not installed"):
        missing("prometheus not installed")
