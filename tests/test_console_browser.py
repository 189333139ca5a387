"""``maka console`` in a real browser: Debian's chromium driven by Playwright (never ``playwright
install``) against a real ``maka console`` process over a real SQLite ledger.

The browser lists the sessions, opens the parked one and sees its park reason and its tool-call
table, opens a session whose host is hostile (``<script>``, a terminal escape, a bidi override)
and finds it shown as text: no dialog opens (the negative control: the same page's text holds the
hostile characters, escaped), and a read-only console shows no button. Screenshots of each page go to
a temp dir, or to ``MAKA_CONSOLE_SCREENSHOTS`` (``docs/assets/console/`` regenerates the committed ones).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from maka_core.runtime.runtime import Runtime
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from tests.test_console import HOSTILE
from tests.test_session_list import _begin, _finish, _ids, make_sessions

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(ledger: Path, *extra: str, address: str | None = None) -> Iterator[str]:
    """``maka console`` on a free port until the loop's next turn; ``address``: a Temporal server
    (else a port where none listens: the console goes ledger-only)."""
    port = _port()
    env = {**os.environ, "MAKA_DB": str(ledger)}
    cmd = [sys.executable, "-m", "maka_temporal.workers.cli.app", "console", "--port", str(port), *extra]
    cmd += ["--address", address or f"127.0.0.1:{_port()}"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.2)
        else:
            pytest.fail("maka console did not listen within 30 s")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.sqlite"
    store = LedgerStore.open(f"sqlite:///{path}")
    root = tmp_path / "ws"
    root.mkdir()
    ws = Workspace.open(root)
    rt = Runtime(store)
    try:
        make_sessions(rt, ws)
        _begin(rt, ws, _ids("hostile", 1), 1800, host=HOSTILE + "y" * 50_000)
        _finish(rt, _ids("hostile", 1), 1801, "failed", park="max_steps_exceeded")
    finally:
        rt.close()
        store.close()
    return path


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("MAKA_CONSOLE_SCREENSHOTS") or tmp_path / "shots")
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture
def browser() -> Iterator[object]:
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium (scripts/test installs it with apt-get as root)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


def test_the_console_in_a_browser(ledger: Path, shots: Path, browser: object) -> None:
    dialogs: list[str] = []
    for base in _serve(ledger):
        page = browser.new_page(viewport={"width": 1200, "height": 800})  # type: ignore[attr-defined]
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(f"{base}/")
        assert page.url.endswith("/sessions")
        rows = page.locator("#sessions tbody tr")
        assert rows.count() == 8, page.content()
        page.screenshot(path=str(shots / "sessions.png"), full_page=False)
        page.click('a[href="/sessions/parked"]')
        assert page.inner_text("#state") == "parked"
        assert page.inner_text("#park-reason") == "max_steps_exceeded"
        page.screenshot(path=str(shots / "session.png"), full_page=False)
        page.goto(f"{base}/sessions/hostile")
        text = page.inner_text("main")
        assert "<script>alert(1)</script>\\x1b[31mred\\u202eevil" in text  # shown, escaped, as text
        assert "more characters)" in text  # the huge host cut
        assert page.locator("script:not([src])").count() == 0 and dialogs == []
        page.screenshot(path=str(shots / "hostile.png"), full_page=False)
        page.goto(f"{base}/sessions/running")
        assert page.locator("button#cancel").count() == 1  # the control for read-only's none
        page.click("#nav-approvals")
        assert page.inner_text("#none-waiting") == "no approval waits"
        page.goto(f"{base}/sessions/nobody")
        assert page.inner_text("#code") == "session_not_found"
        page.screenshot(path=str(shots / "error.png"), full_page=False)
    for base in _serve(ledger, "--read-only"):
        page = browser.new_page()  # type: ignore[attr-defined]
        page.goto(f"{base}/sessions/running")
        assert page.locator("button").count() == 0
        assert page.locator('form[method="post"]').count() == 0
        page.screenshot(path=str(shots / "read-only.png"), full_page=False)
