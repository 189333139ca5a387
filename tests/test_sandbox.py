"""The bash sandbox under real attack: real bwrap, real processes, a real ledger file.

Each attack is one that succeeded against the unsandboxed tool (issue 8). The negative controls
run the same attack with ``unsafe_no_sandbox=True`` on a tool whose bwrap does not exist, to show
the check itself can fail. Tests that need bwrap skip with the probe's reason where it cannot run.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from maka_core.store.writer import LedgerStore
from maka_core.tools import ENV_ALLOWLIST, BashTool, ToolResult, sandbox_status
from maka_core.tools.bash_limits import NO_LIMITS
from maka_core.workspace import MARKER_NAME, Workspace

ROOT = Path(__file__).resolve().parents[1]
STATUS = sandbox_status()
needs_bwrap = pytest.mark.skipif(not STATUS.available, reason=f"bwrap cannot run here: {STATUS.reason}")
NO_BWRAP = "/nonexistent/maka-test/bwrap"
# Variables bash itself sets in any shell it starts.
BASH_OWN = {"PWD", "SHLVL", "_", "OLDPWD"}


def nop() -> None:
    pass


def bash(tool: BashTool, command: str, ws: Workspace) -> ToolResult:
    refused = tool.preflight({"command": command}, ws)
    return refused if refused is not None else tool.run({"command": command}, ws, nop)


def out(result: ToolResult) -> str:
    value = result.result["value"]
    return str(value.get("stdout", "")) + str(value.get("stderr", ""))


def unsandboxed(**kw: object) -> BashTool:
    return BashTool(bwrap=NO_BWRAP, unsafe_no_sandbox=True, **kw)  # type: ignore[arg-type]


def processes_with(tag: str) -> list[int]:
    """Host pids running exactly ``tag`` (``sleep N``), seen in the test's own /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.rstrip(b"\0").split(b"\0") == tag.encode().split():
            found.append(int(entry.name))
    return found


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    (tmp_path / "ws").mkdir()
    return Workspace.open(tmp_path / "ws")


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory outside /tmp (the sandbox's private /tmp would hide a /tmp path anyway)."""
    base = Path("/var/tmp") if os.access("/var/tmp", os.W_OK) else Path.home()
    path = Path(tempfile.mkdtemp(prefix="maka-sandbox-test-", dir=base))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# --- environment ---------------------------------------------------------------------------


@needs_bwrap
def test_worker_secrets_never_reach_the_command(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    canary = "canary-" + uuid.uuid4().hex
    monkeypatch.setenv("MAKA_TEST_CANARY", canary)
    monkeypatch.setenv("OPENAI_API_KEY", canary)
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://{canary}.invalid/v1")
    result = bash(
        BashTool(),
        "env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; cat /proc/$PPID/environ; echo done",
        ws,
    )
    assert "done" in out(result)
    assert canary not in out(result)


@needs_bwrap
def test_env_shows_only_the_allowlist(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("MAKA_TEST_CANARY", "x")
    result = bash(BashTool(), "env -0", ws)
    keys = {item.split("=", 1)[0] for item in result.result["value"]["stdout"].split("\0") if item}
    assert {"PATH", "HOME", "LANG", "TERM", "TZ"} <= keys
    assert keys <= {"PATH", "HOME", "LANG", "TERM", *ENV_ALLOWLIST} | BASH_OWN, keys


def test_unsandboxed_env_is_minimal_too(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    canary = "canary-" + uuid.uuid4().hex
    monkeypatch.setenv("OPENAI_API_KEY", canary)
    result = bash(unsandboxed(), "env; echo home=$HOME", ws)
    assert not result.is_error and "home=" in out(result)
    assert canary not in out(result)
    home = out(result).split("home=")[1].strip()
    assert home != os.environ.get("HOME") and not Path(home).exists()  # private, removed after


# --- filesystem ----------------------------------------------------------------------------


@needs_bwrap
def test_the_workspace_is_the_only_writable_place(ws: Workspace, outside: Path) -> None:
    host_tmp = Path(tempfile.gettempdir()) / f"maka-escape-{uuid.uuid4().hex}"
    escape = bash(BashTool(), f"echo x > {outside}/escaped", ws)
    assert escape.is_error and "Read-only file system" in out(escape)
    for target in (ROOT / "maka-escaped", Path.home() / "maka-escaped", "/usr/maka-escaped"):
        assert bash(BashTool(), f"echo x > {target}", ws).is_error
        assert not Path(target).exists()
    result = bash(BashTool(), f"echo x > {host_tmp}; echo x > $HOME/dotfile; echo x > inside.txt", ws)
    assert not result.is_error, result
    assert not (outside / "escaped").exists()
    assert not host_tmp.exists()  # /tmp inside is private: the host's /tmp never sees the write
    assert (ws.root / "inside.txt").read_text() == "x\n"


def test_negative_control_unsandboxed_write_escapes(ws: Workspace, outside: Path) -> None:
    result = bash(unsandboxed(), f"echo x > {outside}/escaped", ws)
    assert not result.is_error
    assert (outside / "escaped").read_text() == "x\n"


@needs_bwrap
def test_git_internals_and_the_marker_are_read_only(ws: Workspace) -> None:
    subprocess.run(["git", "init", "-q", str(ws.root)], check=True)
    config, marker = ws.root / ".git" / "config", ws.root / MARKER_NAME
    before = {p: p.read_bytes() for p in (config, marker)}
    attacks = [
        "echo '[core] hooksPath = /evil' >> .git/config",
        "echo x > .git/hooks/pre-commit",
        f"echo '{{}}' > {MARKER_NAME}",
        f"rm -f {MARKER_NAME}",
        "mv .git .git-moved",
        "rm -rf .git",
        "git config core.hooksPath /evil",
    ]
    for attack in attacks:
        result = bash(BashTool(), attack, ws)
        assert result.is_error, (attack, result)
    assert {p: p.read_bytes() for p in (config, marker)} == before
    assert not (ws.root / ".git" / "hooks" / "pre-commit").exists()
    assert not (ws.root / ".git-moved").exists()
    # Ordinary work in the workspace still goes through.
    assert not bash(BashTool(), "mkdir -p src && echo ok > src/a.txt && git status --short", ws).is_error


@needs_bwrap
@pytest.mark.parametrize("where", ["maka_home", "separate_file", "inside_workspace"])
def test_the_ledger_is_invisible(ws: Workspace, outside: Path, where: str) -> None:
    home = outside / "maka-home"
    home.mkdir()
    ledger = {
        "maka_home": home / "ledger.sqlite",
        "separate_file": outside / "elsewhere" / "ledger.sqlite",
        "inside_workspace": ws.root / "state" / "ledger.sqlite",
    }[where]
    ledger.parent.mkdir(parents=True, exist_ok=True)
    store = LedgerStore.open(ledger)  # kept open: the -wal/-shm sidecars exist, as in a worker
    try:
        sidecars = [Path(f"{ledger}{s}") for s in ("", "-wal", "-shm") if Path(f"{ledger}{s}").exists()]
        before = {p: p.read_bytes() for p in sidecars}
        tool = BashTool(hidden_paths=(home, ledger))
        attacks = [
            f"cat {ledger}",
            f"head -c 16 {ledger}",
            f"sqlite3 {ledger} \"update runtime_events set payload_json='{{}}'\"",
            f"sqlite3 {ledger} 'select count(*) from runtime_events'",
            f"echo garbage >> {ledger}",
            f"echo garbage > {ledger}-journal",
            f"ls {home}/ledger.sqlite",
        ]
        for attack in attacks:
            result = bash(tool, attack, ws)
            assert result.is_error, (attack, result)
            assert "SQLite format 3" not in out(result)
        assert {p: p.read_bytes() for p in sidecars} == before
        assert not Path(f"{ledger}-journal").exists()
    finally:
        store.close()


def test_negative_control_unsandboxed_ledger_is_readable(ws: Workspace, outside: Path) -> None:
    ledger = outside / "ledger.sqlite"
    LedgerStore.open(ledger).close()
    result = bash(unsandboxed(hidden_paths=(ledger,)), f"head -c 15 {ledger}", ws)
    assert out(result) == "SQLite format 3"


# --- processes -----------------------------------------------------------------------------


@needs_bwrap
@pytest.mark.parametrize("how", ["returns", "times_out"])
def test_no_process_outlives_the_call(ws: Workspace, how: str) -> None:
    tag = f"30{uuid.uuid4().int % 1000}.{os.getpid()}"
    tail = "sleep 0.3; echo started" if how == "returns" else "sleep 60"
    command = f"setsid sleep {tag} & nohup sleep {tag} >/dev/null 2>&1 & (trap '' HUP; sleep {tag}) & {tail}"
    result = bash(BashTool(timeout_s=2.0), command, ws)
    assert (result.error_code == "tool_timeout") == (how == "times_out")
    assert processes_with(f"sleep {tag}") == []


def test_negative_control_unsandboxed_setsid_child_survives(ws: Workspace) -> None:
    tag = f"30{uuid.uuid4().int % 1000}.{os.getpid()}"
    command = f"setsid sleep {tag} >/dev/null 2>&1 & sleep {tag}1 & sleep 0.3; echo started"
    # No limits, so no call cgroup either: where the worker has one, it reaps the escape too.
    result = bash(unsandboxed(limits=NO_LIMITS), command, ws)
    assert not result.is_error
    try:
        deadline = time.monotonic() + 3
        while not (survivors := processes_with(f"sleep {tag}")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert survivors, "setsid escapes a process group: this is what the PID namespace is for"
        assert processes_with(f"sleep {tag}1") == []  # but its own group is killed on return
    finally:
        for pid in processes_with(f"sleep {tag}"):
            os.kill(pid, signal.SIGKILL)


@needs_bwrap
def test_a_killed_worker_takes_the_command_with_it(ws: Workspace) -> None:
    tag = f"30{uuid.uuid4().int % 1000}.{os.getpid()}"
    child = textwrap.dedent(f"""
        from maka_core.tools import BashTool
        from maka_core.workspace import Workspace
        BashTool().run({{"command": "setsid sleep {tag} & sleep {tag}"}}, Workspace.open({str(ws.root)!r}),
                       lambda: None)
    """)
    worker = subprocess.Popen([sys.executable, "-c", child], cwd=ROOT)
    try:
        deadline = time.monotonic() + 10
        while len(processes_with(f"sleep {tag}")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(processes_with(f"sleep {tag}")) == 2
    finally:
        worker.kill()
        worker.wait()
    deadline = time.monotonic() + 3
    while processes_with(f"sleep {tag}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(f"sleep {tag}") == []


# --- network -------------------------------------------------------------------------------


@needs_bwrap
@pytest.mark.parametrize(
    ("permitted", "granted"), [(False, False), (True, False), (False, True), (True, True)]
)
def test_network_only_when_granted(ws: Workspace, permitted: bool, granted: bool) -> None:
    # Two keys (the worker's --bash-network, the call's policy grant): one alone is no network.
    network = permitted and granted
    accepted: list[bool] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(5)
        port = listener.getsockname()[1]

        def accept() -> None:
            try:
                conn, _ = listener.accept()
                conn.close()
                accepted.append(True)
            except OSError:
                pass

        waiter = threading.Thread(target=accept)
        waiter.start()
        command = f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"
        result = bash(BashTool(network_permitted=permitted).with_network(granted), command, ws)
        if not network:
            # Unblock the accept without a client from inside the sandbox.
            with socket.create_connection(("127.0.0.1", port)):
                pass
        waiter.join(timeout=10)
    if network:
        assert not result.is_error and out(result).strip() == "connected"
    else:
        assert result.is_error and "connected" not in result.result["value"]["stdout"]
        assert "refused" in out(result) or "unreachable" in out(result), out(result)


# --- no sandbox ----------------------------------------------------------------------------


def test_without_a_sandbox_bash_is_refused(ws: Workspace) -> None:
    tool = BashTool(bwrap=NO_BWRAP)
    assert not tool.sandbox.available and "not found" in (tool.sandbox.reason or "")
    refused = tool.preflight({"command": "echo x > made.txt"}, ws)
    assert refused is not None and refused.error_code == "sandbox_unavailable"
    direct = tool.run({"command": "echo x > made.txt"}, ws, nop)
    assert direct.error_code == "sandbox_unavailable"
    assert not (ws.root / "made.txt").exists()
    assert "bash refused" in tool.isolation()
    assert "UNSANDBOXED" in unsandboxed().isolation()


@needs_bwrap
def test_sandbox_status_probes_bwrap() -> None:
    assert STATUS.available and STATUS.bwrap and (STATUS.version or "").startswith("bubblewrap")
    assert sandbox_status() is STATUS  # probed once per process
    assert BashTool().isolation().startswith("sandboxed")


@needs_bwrap
def test_a_workspace_inside_maka_home_stays_writable_with_the_ledger_hidden(outside: Path) -> None:
    home = outside / "maka-home"
    (home / "ws").mkdir(parents=True)
    ws = Workspace.open(home / "ws")
    ledger = home / "ledger.sqlite"
    LedgerStore.open(ledger).close()
    before = ledger.read_bytes()
    tool = BashTool(hidden_paths=(home, ledger))
    listing = bash(tool, f"echo x > made.txt && ls -A {home}", ws)
    assert not listing.is_error and listing.result["value"]["stdout"] == "ws\n"
    assert (ws.root / "made.txt").read_text() == "x\n"
    for attack in (f"cat {ledger}", f"echo x > {home}/planted", f"echo x >> {ledger}"):
        assert bash(tool, attack, ws).is_error, attack
    assert ledger.read_bytes() == before and not (home / "planted").exists()


@needs_bwrap
def test_a_ledger_directly_in_the_workspace_root_refuses_bash(ws: Workspace) -> None:
    ledger = ws.root / "ledger.sqlite"
    LedgerStore.open(ledger).close()
    tool = BashTool(hidden_paths=(ledger,))
    refused = tool.preflight({"command": f"cat {ledger}"}, ws)
    assert refused is not None and refused.error_code == "sandbox_unavailable"
    assert tool.run({"command": f"cat {ledger}"}, ws, nop).error_code == "sandbox_unavailable"
