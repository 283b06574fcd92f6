"""A test whose outside tool is missing: skipped on a developer's machine, failed in CI.

`make test` installs every tool (Debian's chromium and prometheus, Playwright); in CI
(`.ci/run` sets CI) a missing one means the set-up broke, and skipping would let every test
that needs it pass without running."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(what: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"CI: {what}")
    pytest.skip(what)
