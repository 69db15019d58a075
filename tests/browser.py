"""The system's Chromium, as the dashboard's browser tests drive it (through Playwright)."""

from __future__ import annotations

import os
import shutil

import pytest

#: as root in a sandbox, with no network: no sandbox, and none of Chromium's own connections
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def chromium() -> str:
    """The Chromium binary, or the test skipped saying how to get one."""
    path = os.environ.get("EDDYLINE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("no Chromium on this machine: ./dev.sh test installs Debian's 'chromium' where it may "
                    "(root and apt-get); or set EDDYLINE_CHROMIUM to a Chromium binary")
    return path
