"""The built-in tools on real files and real bash processes (crashes are real SIGKILLs)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from maka_core.facts import canonical_json
from maka_core.tools import BashTool, ReadFileTool, Tool, ToolResult, provider_tool_specs
from maka_core.tools.registry import default_tools
from maka_core.workspace import MARKER_NAME, Workspace

ROOT = Path(__file__).resolve().parents[1]


def nop() -> None:
    pass


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace.open(tmp_path)


@pytest.fixture
def tools() -> dict[str, Tool]:
    return default_tools()


def run(tool: Tool, args: dict, ws: Workspace) -> ToolResult:
    """Preflight then run, as the activity does."""
    refused = tool.preflight(args, ws)
    return refused if refused is not None else tool.run(args, ws, nop)


# --- registry ------------------------------------------------------------------------------


MELRA_PLAN_FIELDS = [
    "goal", "budget", "identity", "operation", "constraints", "reconciliation", "forbiddenEffects",
    "requiredEvidence",
]  # fmt: skip


def test_registry_names_modes_and_provider_specs() -> None:
    tools = default_tools()
    assert {n: t.recovery_mode for n, t in tools.items()} == {
        "read_file": "replay_safe",
        "list_dir": "replay_safe",
        "write_file": "reconcile",
        "edit_file": "reconcile",
        "bash": "never_auto_retry",
        # The MELRA family: plan and the readers are re-run safely; execute, unbound, parks.
        "melra_plan": "replay_safe",
        "melra_execute": "never_auto_retry",
        "melra_task_status": "replay_safe",
        "melra_receipt": "replay_safe",
    }
    assert {n for n, t in tools.items() if t.mutates} == {"write_file", "edit_file", "bash", "melra_execute"}
    assert all(isinstance(t, Tool) for t in tools.values())
    specs = provider_tool_specs(tools)
    by_name = {s["function"]["name"]: s for s in specs}
    assert all(s["type"] == "function" for s in specs)
    assert {n: sorted(s["function"]["parameters"]["properties"]) for n, s in by_name.items()} == {
        "bash": ["command"],
        "edit_file": ["new_text", "old_text", "path"],
        "list_dir": ["path"],
        "read_file": ["path"],
        "write_file": ["content", "path"],
        "melra_plan": sorted(MELRA_PLAN_FIELDS),
        "melra_execute": ["approval", "taskId"],
        "melra_task_status": ["taskId"],
        "melra_receipt": ["receiptId", "taskId"],
    }
    assert provider_tool_specs(list(tools.values())) == specs
    json.dumps(specs)  # plain JSON for the SDK


def test_tools_import_in_either_order() -> None:
    for first in ("maka_core.tools", "maka_core.workspace", "maka_core.policy", "maka_core.tools.evidence"):
        subprocess.run(
            [sys.executable, "-c", f"import {first}; import maka_core.workspace"], cwd=ROOT, check=True
        )


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("read_file", {}),
        ("read_file", {"path": 3}),
        ("read_file", {"path": "a", "extra": 1}),
        ("write_file", {"path": "a"}),
        ("write_file", {"path": "a", "content": None}),
        ("edit_file", {"path": "a", "old_text": "x"}),
        ("bash", {"command": ""}),
        ("bash", {"command": ["ls"]}),
        ("list_dir", "."),
    ],
)
def test_bad_args_are_refused_in_preflight(ws: Workspace, tools: dict[str, Tool], name: str, args) -> None:
    result = tools[name].preflight(args, ws)
    assert result is not None and result.is_error and result.error_code == "invalid_args"
    assert tools[name].run(args, ws, nop).error_code == "invalid_args"


# --- read tools ----------------------------------------------------------------------------


def test_read_file_and_its_errors(ws: Workspace, tools: dict[str, Tool]) -> None:
    (ws.root / "a.txt").write_text("héllo\n")
    (ws.root / "bin").write_bytes(b"\xff\x00")
    (ws.root / "d").mkdir()
    assert run(tools["read_file"], {"path": "a.txt"}, ws) == ToolResult({"kind": "text", "text": "héllo\n"})
    assert run(tools["read_file"], {"path": "bin"}, ws).error_code == "file_not_text"
    assert run(tools["read_file"], {"path": "missing"}, ws).error_code == "file_not_found"
    assert run(tools["read_file"], {"path": "d"}, ws).error_code == "not_a_file"


def test_result_limit_counts_serialized_size(ws: Workspace) -> None:
    tool = ReadFileTool(result_byte_limit=1000)
    # 400 raw bytes that serialize to more than 1000 (each newline is escaped as two bytes).
    (ws.root / "nl.txt").write_text("\n" * 490)
    (ws.root / "ok.txt").write_text("\n" * 480)
    (ws.root / "big.txt").write_text("x" * 5000)
    ok = run(tool, {"path": "ok.txt"}, ws)
    assert not ok.is_error and ok.serialized_size() <= 1000
    too = run(tool, {"path": "nl.txt"}, ws)
    assert too.error_code == "tool_result_too_large"
    assert too.result["value"]["size"] > 1000 and too.result["value"]["limit"] == 1000
    assert run(tool, {"path": "big.txt"}, ws).error_code == "tool_result_too_large"


def test_list_dir(ws: Workspace, tools: dict[str, Tool]) -> None:
    (ws.root / "b.txt").write_text("12345")
    (ws.root / "a").mkdir()
    (ws.root / "link").symlink_to(ws.root / "b.txt")
    os.mkfifo(ws.root / "fifo")
    result = run(tools["list_dir"], {"path": "."}, ws)
    assert result.result == {
        "kind": "json",
        "value": {
            "path": ".",
            "entries": [
                {"name": MARKER_NAME, "type": "file", "size": (ws.root / MARKER_NAME).stat().st_size},
                {"name": "a", "type": "dir"},
                {"name": "b.txt", "type": "file", "size": 5},
                {"name": "fifo", "type": "other"},
                {"name": "link", "type": "symlink"},
            ],
        },
    }
    assert run(tools["list_dir"], {"path": "b.txt"}, ws).error_code == "not_a_directory"
    assert run(tools["list_dir"], {"path": "nope"}, ws).error_code == "file_not_found"


# --- write tools ---------------------------------------------------------------------------


def test_write_file_creates_replaces_and_preserves_mode(ws: Workspace, tools: dict[str, Tool]) -> None:
    result = run(tools["write_file"], {"path": "sub/dir/new.txt", "content": "hi\n"}, ws)
    assert not result.is_error
    assert result.result["value"]["path"] == "sub/dir/new.txt" and result.result["value"]["bytes"] == 3
    assert (ws.root / "sub/dir/new.txt").read_text() == "hi\n"
    target = ws.root / "script.sh"
    target.write_text("old")
    target.chmod(0o750)
    inode = target.stat().st_ino
    assert not run(tools["write_file"], {"path": "script.sh", "content": "new"}, ws).is_error
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    assert target.stat().st_ino != inode  # replaced by rename, not rewritten in place
    leftovers = [p for p in ws.root.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []


def test_write_file_refuses_directories_and_oversize(ws: Workspace) -> None:
    tools = default_tools(max_file_bytes=10)
    (ws.root / "d").mkdir()
    assert run(tools["write_file"], {"path": "d", "content": "x"}, ws).error_code == "not_a_file"
    assert run(tools["write_file"], {"path": "f", "content": "x" * 11}, ws).error_code == "file_too_large"
    assert not (ws.root / "f").exists()


def test_edit_file_exact_once(ws: Workspace, tools: dict[str, Tool]) -> None:
    f = ws.root / "config.json"
    f.write_text('{"port": 3000, "name": "aaa"}\n')
    edit = tools["edit_file"]

    def code(old: str, new: str, path: str = "config.json") -> str | None:
        return run(edit, {"path": path, "old_text": old, "new_text": new}, ws).error_code

    assert code("5000", "4000") == "edit_text_not_found"
    assert code('"', "'") == "edit_text_ambiguous"
    assert code("aa", "b") == "edit_text_ambiguous"  # overlapping occurrences count too
    assert code("", "x") == "invalid_args"
    assert code("3000", "3000") == "edit_no_change"
    assert code("x", "y", path="missing.txt") == "file_not_found"
    assert f.read_text() == '{"port": 3000, "name": "aaa"}\n'  # every refusal left it alone
    result = run(edit, {"path": "config.json", "old_text": "3000", "new_text": "4000"}, ws)
    assert not result.is_error and result.result["value"]["path"] == "config.json"
    assert f.read_text() == '{"port": 4000, "name": "aaa"}\n'


def test_edit_refused_at_run_time_when_file_changed_after_preflight(
    ws: Workspace, tools: dict[str, Tool]
) -> None:
    f = ws.root / "a.txt"
    f.write_text("one")
    args = {"path": "a.txt", "old_text": "one", "new_text": "two"}
    assert tools["edit_file"].preflight(args, ws) is None
    f.write_text("three")
    assert tools["edit_file"].run(args, ws, nop).error_code == "edit_text_not_found"
    assert f.read_text() == "three"


_CRASH = """
import json, sys
from maka_core.workspace import Workspace
from maka_core.tools.registry import default_tools
ws = Workspace.open(sys.argv[1])
tool = default_tools()[sys.argv[2]]
args = json.loads(sys.stdin.readline())
print("ready", flush=True)
print(tool.run(args, ws, lambda: None).result, flush=True)
"""


def _run_in_child(ws: Workspace, name: str, args: dict, failpoint: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKA_FAILPOINT")}
    if failpoint:
        env |= {"MAKA_FAILPOINT": failpoint, "MAKA_FAILPOINT_TAG": name}
    return subprocess.run(
        [sys.executable, "-c", _CRASH, str(ws.root), name],
        cwd=ROOT,
        env=env,
        input=json.dumps(args) + "\n",
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.crash
@pytest.mark.parametrize(("point", "expected"), [("P3", "old\n"), ("P4", "new\n"), (None, "new\n")])
def test_write_killed_at_failpoints_leaves_old_or_new_bytes(
    ws: Workspace, point: str | None, expected: str
) -> None:
    (ws.root / "f.txt").write_text("old\n")
    proc = _run_in_child(ws, "write_file", {"path": "f.txt", "content": "new\n"}, point)
    assert proc.returncode == (-signal.SIGKILL if point else 0), proc.stderr
    assert (proc.stdout == "ready\n") == bool(point)  # killed before returning a result
    assert (ws.root / "f.txt").read_text() == expected
    assert sorted(p.name for p in ws.root.iterdir()) == sorted([MARKER_NAME, "f.txt"])


@pytest.mark.crash
def test_write_killed_at_random_moments_is_never_torn(ws: Workspace) -> None:
    old, new = b"o" * (4 << 20), b"n" * (4 << 20)
    target = ws.root / "big.bin"
    seen = set()
    line = json.dumps({"path": "big.bin", "content": new.decode()}) + "\n"
    for i in range(8):
        target.write_bytes(old)
        child = subprocess.Popen(
            [sys.executable, "-c", _CRASH, str(ws.root), "write_file"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(line)
        child.stdin.flush()
        assert child.stdout.readline() == "ready\n"
        time.sleep(0.004 * i)  # from right away to well into the write
        child.send_signal(signal.SIGKILL)
        child.wait()
        data = target.read_bytes()
        assert data in (old, new), f"torn file after kill {i}"
        seen.add(data == new)
    # Temp files may survive a kill (never the target): they are hidden names beside it.
    for p in ws.root.iterdir():
        assert p.name in (MARKER_NAME, "big.bin") or p.name.startswith(".big.bin.maka-")


# --- bash ----------------------------------------------------------------------------------


def test_bash_runs_in_the_workspace_root(ws: Workspace, tools: dict[str, Tool]) -> None:
    result = run(tools["bash"], {"command": "pwd; echo err >&2; printf 'x' > made.txt"}, ws)
    assert result == ToolResult(
        {"kind": "json", "value": {"exitCode": 0, "stdout": f"{ws.root}\n", "stderr": "err\n"}}
    )
    assert (ws.root / "made.txt").read_text() == "x"


def test_bash_nonzero_exit_is_an_error_result(ws: Workspace, tools: dict[str, Tool]) -> None:
    result = run(tools["bash"], {"command": "echo out; exit 3"}, ws)
    assert result.is_error
    assert result.result == {"kind": "json", "value": {"exitCode": 3, "stdout": "out\n", "stderr": ""}}


def test_bash_timeout_kills_the_process_group_and_heartbeats(ws: Workspace) -> None:
    beats: list[float] = []
    tool = BashTool(timeout_s=2.0)
    start = time.monotonic()
    result = tool.run(
        {"command": "(sleep 30; echo late > late.txt) & sleep 30"}, ws, lambda: beats.append(time.monotonic())
    )
    elapsed = time.monotonic() - start
    assert result.error_code == "tool_timeout"
    assert elapsed < 5
    assert len(beats) >= 2
    gaps = [b - a for a, b in zip([start, *beats], [*beats, start + elapsed], strict=True)]
    assert max(gaps) < 1.0, gaps
    time.sleep(0.2)
    assert not (ws.root / "late.txt").exists()


def test_bash_heartbeats_at_least_every_second(ws: Workspace) -> None:
    beats: list[float] = []
    start = time.monotonic()
    result = BashTool().run({"command": "sleep 2.2; echo done"}, ws, lambda: beats.append(time.monotonic()))
    end = time.monotonic()
    assert result.result["value"]["stdout"] == "done\n"
    assert len(beats) >= 3
    gaps = [b - a for a, b in zip([start, *beats], [*beats, end], strict=True)]
    assert max(gaps) < 1.0, gaps


def test_bash_output_over_the_limit_is_refused_not_truncated(ws: Workspace) -> None:
    tool = BashTool(result_byte_limit=1000)
    result = tool.run({"command": "head -c 5000000 /dev/zero | tr '\\0' x"}, ws, nop)
    assert result.error_code == "tool_result_too_large"
    assert result.result["value"]["size"] == 5_000_000 and result.result["value"]["exitCode"] == 0
    # Escaping pushes a raw-small output over the limit too: the limit counts serialized bytes.
    quotes = tool.run({"command": "head -c 600 /dev/zero | tr '\\0' '\"'"}, ws, nop)
    assert quotes.error_code == "tool_result_too_large"
    fine = tool.run({"command": "head -c 600 /dev/zero | tr '\\0' x"}, ws, nop)
    assert not fine.is_error and len(canonical_json.dumps(fine.result)) <= 1000


def test_bash_background_child_does_not_hold_the_result(ws: Workspace, tools: dict[str, Tool]) -> None:
    start = time.monotonic()
    result = run(tools["bash"], {"command": "sleep 20 & echo started"}, ws)
    assert time.monotonic() - start < 4
    assert result.result["value"]["stdout"] == "started\n"


def test_bash_kill_running_on_shutdown(ws: Workspace) -> None:
    tool = BashTool()
    out: list[ToolResult] = []
    t = threading.Thread(target=lambda: out.append(tool.run({"command": "sleep 30"}, ws, nop)))
    t.start()
    deadline = time.monotonic() + 5
    while not tool.kill_running() and time.monotonic() < deadline:
        time.sleep(0.05)
    t.join(timeout=5)
    assert not t.is_alive()
    assert out[0].is_error and out[0].result["value"]["exitCode"] == -signal.SIGKILL


def test_bash_has_no_reconciler(ws: Workspace, tools: dict[str, Tool]) -> None:
    assert tools["bash"].reconcile({"command": "echo x >> log"}, ws, None) is None
    assert tools["bash"].capture_evidence({"command": "echo x >> log"}, ws) is None


def test_bash_is_killed_when_the_heartbeat_raises(ws: Workspace) -> None:
    class Cancelled(Exception):
        pass

    beats = []

    def heartbeat() -> None:
        beats.append(1)
        if len(beats) == 2:  # after the command started and ran for a moment
            raise Cancelled

    start = time.monotonic()
    with pytest.raises(Cancelled):
        BashTool(heartbeat_interval_s=0.1).run({"command": "sleep 1; echo late > late.txt"}, ws, heartbeat)
    assert time.monotonic() - start < 0.9
    time.sleep(1.3)
    assert not (ws.root / "late.txt").exists()


def test_failpoints_do_not_leak_into_commands(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAKA_FAILPOINT", "P3")
    result = BashTool().run({"command": "echo ${MAKA_FAILPOINT:-unset}"}, ws, nop)
    assert result.result["value"]["stdout"] == "unset\n"
