"""Attacks on the file tools and the workspace, run for real: a process swapping a directory for a
symlink while the tools read and write, FIFOs, git metadata, hard links, non-UTF-8 names, failed
writes. Each attack once succeeded against the path-based tools; these tests keep it failing."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from maka_core.facts import codec
from maka_core.facts.events import FunctionResponseContent, Refs, RuntimeEvent
from maka_core.tools import ToolResult
from maka_core.tools.beneath import write_replace
from maka_core.tools.registry import default_tools
from maka_core.workspace import Workspace

ROOT = Path(__file__).resolve().parents[1]
TOOLS = default_tools()


def nop() -> None:
    pass


def call(name: str, args: dict, ws: Workspace) -> ToolResult:
    """Preflight then run, as the activity does."""
    tool = TOOLS[name]
    refused = tool.preflight(args, ws)
    return refused if refused is not None else tool.run(args, ws, nop)


def leftovers(*dirs: Path) -> list[str]:
    return [str(p) for d in dirs for p in d.rglob("*.maka-*.tmp")]


# --- the swap race -------------------------------------------------------------------------

# Exchanges two names as fast as it can: renameat2(RENAME_EXCHANGE) where libc has it, else a
# cycle of plain renames through a third name (slower, and the swapped states are the same).
SWAPPER = r"""
import ctypes, os, sys
a, b = sys.argv[1], sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)
exchange = getattr(libc, "renameat2", None)
print("swapping", flush=True)
if exchange is not None and exchange(-100, a.encode(), -100, b.encode(), 2) == 0:
    while True:
        exchange(-100, a.encode(), -100, b.encode(), 2)
hold = a + ".hold"
while True:
    os.rename(a, hold); os.rename(b, a); os.rename(a, b); os.rename(hold, a)
"""


@pytest.fixture
def race(tmp_path: Path):
    """A workspace whose ``sub`` is swapped with ``L -> ../outside`` by another process."""
    root, outside = tmp_path / "ws", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "sub" / "secret.txt").write_text("inside")
    (outside / "secret.txt").write_text("OUTSIDE")
    (outside / "only-outside.txt").write_text("")
    (root / "L").symlink_to("../outside")
    ws = Workspace.open(root)
    proc = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(root / "sub"), str(root / "L")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "swapping\n"
        yield ws, outside
    finally:
        proc.kill()
        proc.wait(timeout=10)


def naive_read(root: Path, rel: str) -> bytes | None:
    """The old way: check the real path, then open by name (the window the swap exploits)."""
    try:
        real = os.path.realpath(root / rel)  # the race can make even this raise
        if not real.startswith(str(root) + os.sep):
            return None
        with open(root / rel, "rb") as fh:
            return fh.read()
    except OSError:
        return None


RACE_SECONDS = 5.0


def test_swapping_a_directory_for_a_symlink_never_reaches_outside(race) -> None:
    ws, outside = race
    counts = dict.fromkeys(
        ["naive_escapes", "outside_reads", "outside_lists", "inside_reads", "writes", "refused", "uncaught"],
        0,
    )
    codes: dict[str, int] = {}
    calls = 0
    start = time.monotonic()
    # At least RACE_SECONDS, and on until the control has won once (the machine may be busy).
    while (elapsed := time.monotonic() - start) < RACE_SECONDS or (
        not counts["naive_escapes"] and elapsed < 40
    ):
        # Negative control, interleaved so it runs under the same scheduling: a check-then-open
        # reader does get redirected outside by this race, so the swapper is really live.
        counts["naive_escapes"] += sum(naive_read(ws.root, "sub/secret.txt") == b"OUTSIDE" for _ in range(5))
        for name, args in (
            ("read_file", {"path": "sub/secret.txt"}),
            ("write_file", {"path": f"sub/w{calls}.txt", "content": f"w{calls}"}),
            ("edit_file", {"path": "sub/secret.txt", "old_text": "inside", "new_text": "INSIDE"}),
            ("edit_file", {"path": "sub/secret.txt", "old_text": "INSIDE", "new_text": "inside"}),
            ("list_dir", {"path": "sub"}),
        ):
            calls += 1
            try:
                result = call(name, args, ws)
            except Exception:
                counts["uncaught"] += 1
                continue
            if result.is_error:
                counts["refused"] += 1
                codes[f"{name}:{result.error_code}"] = codes.get(f"{name}:{result.error_code}", 0) + 1
            elif name == "read_file":
                text = result.result["text"]
                counts["outside_reads" if text == "OUTSIDE" else "inside_reads"] += 1
            elif name == "write_file":
                counts["writes"] += 1
            elif name == "list_dir":
                names = {e["name"] for e in result.result["value"]["entries"]}
                counts["outside_lists"] += "only-outside.txt" in names
    outside_names = sorted(p.name for p in outside.iterdir())
    print(calls, counts, codes, "outside:", len(outside_names), outside_names[:4])
    assert counts["naive_escapes"] > 0, "the swapper never won against a naive reader: this proves nothing"
    assert counts["uncaught"] == 0
    assert counts["outside_reads"] == 0 and counts["outside_lists"] == 0
    assert outside_names == ["only-outside.txt", "secret.txt"]
    assert (outside / "secret.txt").read_text() == "OUTSIDE"
    assert counts["inside_reads"] > 0 and counts["writes"] > 0  # the tools still work under the race
    assert leftovers(ws.root, outside) == []


# --- FIFOs, devices, sockets ---------------------------------------------------------------


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    Workspace.open(tmp_path)
    os.mkfifo(tmp_path / "pipe")
    # A child, so a blocking open() cannot wedge the test run: it is killed at the timeout.
    code = (
        "import json, sys; from maka_core.tools.registry import default_tools\n"
        "from maka_core.workspace import Workspace\n"
        "ws = Workspace.open(sys.argv[1], create=False); t = default_tools()\n"
        "calls = [('read_file', {'path': 'pipe'}), ('write_file', {'path': 'pipe', 'content': 'x'}),\n"
        "         ('edit_file', {'path': 'pipe', 'old_text': 'a', 'new_text': 'b'}),\n"
        "         ('list_dir', {'path': 'pipe'})]\n"
        "print(json.dumps([t[n].run(a, ws, lambda: None).error_code for n, a in calls]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=20
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [
        "not_regular_file",
        "not_regular_file",
        "not_regular_file",
        "not_a_directory",
    ]
    assert (tmp_path / "pipe").exists() and leftovers(tmp_path) == []


def test_device_node_is_refused(tmp_path: Path) -> None:
    ws = Workspace.open(tmp_path)
    (tmp_path / "null").symlink_to("/dev/null")  # leads outside: refused before any open
    assert call("read_file", {"path": "null"}, ws).error_code == "path_outside_workspace"
    if os.geteuid() == 0:
        os.mknod(tmp_path / "dev", 0o600 | 0o020000, os.makedev(1, 3))  # a character device
        assert call("read_file", {"path": "dev"}, ws).error_code == "not_regular_file"


# --- git metadata and the marker -----------------------------------------------------------


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_git_metadata_is_protected_from_writes(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    ws = Workspace.open(tmp_path)
    (tmp_path / "g").symlink_to(".git")  # an alias inside the workspace
    (tmp_path / "nested").mkdir()
    config = tmp_path / ".git" / "config"
    before = config.read_bytes()
    pwned = tmp_path / "pwned"
    payload = f"[core]\n\tfsmonitor = touch {pwned}\n"
    attempts = [
        ("write_file", {"path": ".git/config", "content": payload}),
        ("write_file", {"path": "./.git//config", "content": payload}),
        ("write_file", {"path": "g/config", "content": payload}),
        ("write_file", {"path": ".GIT/config", "content": payload}),
        ("write_file", {"path": ".git/hooks/pre-commit", "content": "#!/bin/sh\n"}),
        ("write_file", {"path": ".git", "content": "gitdir: /tmp/evil\n"}),
        ("write_file", {"path": "nested/.git/config", "content": payload}),
        ("edit_file", {"path": ".git/config", "old_text": "[core]", "new_text": payload}),
        ("write_file", {"path": ".maka-workspace.json", "content": "{}"}),
    ]
    for name, args in attempts:
        assert call(name, args, ws).error_code == "protected_path", args
    assert config.read_bytes() == before
    assert not (tmp_path / "nested" / ".git").exists()
    subprocess.run(["git", "-C", str(tmp_path), "status", "--porcelain"], check=True, capture_output=True)
    assert not pwned.exists()
    # Reads stay allowed: looking at git metadata changes nothing and bash can read it anyway.
    assert call("read_file", {"path": ".git/config"}, ws).result["text"] == before.decode()
    assert not call("list_dir", {"path": ".git"}, ws).is_error


# --- hard links ----------------------------------------------------------------------------


def test_hard_linked_files_are_not_written(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    ws = Workspace.open(tmp_path / "ws")
    outside = tmp_path / "outside.txt"
    outside.write_text("outside data")
    os.link(outside, tmp_path / "ws" / "linked.txt")
    assert call("write_file", {"path": "linked.txt", "content": "x"}, ws).error_code == "hardlinked_target"
    edit = {"path": "linked.txt", "old_text": "outside", "new_text": "inside"}
    assert call("edit_file", edit, ws).error_code == "hardlinked_target"
    assert outside.read_text() == "outside data" and os.stat(outside).st_nlink == 2
    # Reading one is allowed (documented): creating the link already needed access to the file.
    assert call("read_file", {"path": "linked.txt"}, ws).result["text"] == "outside data"


# --- non-UTF-8 names -----------------------------------------------------------------------


def test_non_utf8_names_are_listed_losslessly_and_the_ledger_accepts_them(tmp_path: Path) -> None:
    ws = Workspace.open(tmp_path)
    raw = os.fsencode(str(tmp_path)) + b"/bad\xffname\xc3"
    with open(raw, "wb") as fh:
        fh.write(b"x")
    (tmp_path / "ok.txt").write_text("y")
    result = call("list_dir", {"path": "."}, ws)
    entries = {e["name"]: e for e in result.result["value"]["entries"]}
    assert entries["bad\\xffname\\xc3"] == {"name": "bad\\xffname\\xc3", "type": "file", "size": 1,
                                            "nameEncoding": "escaped"}  # fmt: skip
    assert entries["ok.txt"] == {"name": "ok.txt", "type": "file", "size": 1}
    event = RuntimeEvent(
        id="e1", invocation_id="i", run_id="r", session_id="s", turn_id="t", ts=1, partial=False,
        role="tool", author="tool", refs=Refs(operation_id="op", tool_call_id="c"),
        content=FunctionResponseContent(id="c", name="list_dir", result=result.result, is_error=False),
    )  # fmt: skip
    assert codec.decode(codec.encode(event)) == event


def test_a_symlink_to_a_non_utf8_name_is_refused_not_committed(tmp_path: Path) -> None:
    ws = Workspace.open(tmp_path)
    os.symlink(b"bad\xff", os.fsencode(str(tmp_path)) + b"/alias")
    assert call("write_file", {"path": "alias/x", "content": "x"}, ws).error_code in {
        "path_invalid",
        "not_a_directory",
    }


# --- failed writes -------------------------------------------------------------------------


def test_a_write_that_fails_midway_leaves_no_temp_file(tmp_path: Path) -> None:
    Workspace.open(tmp_path)
    (tmp_path / "f.txt").write_text("old")
    # A real EFBIG from the kernel: the file-size limit stops the write after the temp file exists.
    code = (
        "import json, resource, signal, sys; from maka_core.tools.registry import default_tools\n"
        "from maka_core.workspace import Workspace\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))\n"
        "ws = Workspace.open(sys.argv[1], create=False)\n"
        "r = default_tools()['write_file'].run({'path': 'f.txt', 'content': 'x' * 5000}, ws, lambda: None)\n"
        "print(r.error_code)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "tool_io_failed"
    assert (tmp_path / "f.txt").read_text() == "old"
    assert leftovers(tmp_path) == []
    assert resource.getrlimit(resource.RLIMIT_FSIZE)[0] == resource.RLIM_INFINITY  # limit stayed in the child


def test_a_rename_that_fails_removes_its_temp_file(tmp_path: Path) -> None:
    (tmp_path / "target" / "child").mkdir(parents=True)  # rename onto a non-empty directory fails
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError):
            write_replace(fd, "target", b"data")
    finally:
        os.close(fd)
    assert leftovers(tmp_path) == [] and (tmp_path / "target" / "child").is_dir()
