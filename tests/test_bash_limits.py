"""Issue 23, finding 1.7: one bash call's memory, processes, /tmp and file size are bounded.

Each limit is hit by a real command in the real sandbox, with small limits built by the test
(64 MiB of memory, not gigabytes), and the model sees ``bash_resource_limit`` naming it. The
negative control is the same line under no limits (main's bash): it gets past the bound.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from maka_core.errors import ConfigError
from maka_core.settings import load_settings
from maka_core.tools import BashTool, ToolResult, sandbox_status
from maka_core.tools.bash_limits import (
    CGROUP_PREFIX,
    NO_LIMITS,
    BashLimits,
    CgroupParent,
    Enforcement,
    MiB,
    cgroup_parents,
    own_cgroups,
)
from maka_core.tools.registry import default_tools
from maka_core.workspace import Workspace

STATUS = sandbox_status()
pytestmark = pytest.mark.skipif(not STATUS.available, reason=f"bwrap cannot run here: {STATUS.reason}")
SMALL = BashLimits(memory_bytes=64 * MiB, processes=32, tmp_bytes=16 * MiB, file_bytes=32 * MiB)
needs_cgroup = {
    c: pytest.mark.skipif(c not in cgroup_parents(), reason=f"no writable {c} cgroup for the worker here")
    for c in ("memory", "pids")
}


def bash(tool: BashTool, command: str, ws: Workspace) -> ToolResult:
    refused = tool.preflight({"command": command}, ws)
    return refused if refused is not None else tool.run({"command": command}, ws, lambda: None)


@pytest.fixture
def ws() -> Iterator[Workspace]:
    base = Path("/var/tmp") if os.access("/var/tmp", os.W_OK) else Path.home()
    path = Path(tempfile.mkdtemp(prefix="maka-limits-", dir=base))
    (path / "ws").mkdir()
    yield Workspace.open(path / "ws")
    shutil.rmtree(path, ignore_errors=True)


# (limit, line, what the line prints when nothing stops it)
LINES = [
    pytest.param(
        "memory",
        "python3 -c 'b = b\"x\" * (160 << 20); print(len(b))'",
        str(160 * MiB),
        marks=needs_cgroup["memory"],
        id="memory",
    ),
    pytest.param(
        "processes",
        "python3 -c '\nimport os, time\nfor i in range(100):\n    if os.fork() == 0:\n        time.sleep(5)\n"
        "        os._exit(0)\nprint(i + 1)'",
        "100",
        marks=needs_cgroup["pids"],
        id="processes",
    ),
    pytest.param(
        "tmp_size", "head -c 24M /dev/zero > /tmp/x; stat -c %s /tmp/x", str(24 * MiB), id="tmp_size"
    ),
    # The writer is the line's last command: its status (128 + SIGXFSZ) is how the limit shows.
    pytest.param("file_size", "head -c 48M /dev/zero > big", str(48 * MiB), id="file_size"),
]
# What the line left, for the lines that print nothing themselves.
MEASURE = {"file_size": "stat -c %s big"}


@pytest.mark.parametrize(("limit", "line", "unbounded"), LINES)
def test_each_limit_stops_a_real_command_and_the_model_sees_which(
    ws: Workspace, limit: str, line: str, unbounded: str
) -> None:
    result = bash(BashTool(limits=SMALL), line, ws)
    assert result.error_code == "bash_resource_limit", result
    value = result.result["value"]
    assert value["limit"] == limit and value["limits"] == {limit: SMALL.value(limit)}, value  # type: ignore[arg-type]
    assert "exitCode" in value and "stdout" in value and "stderr" in value
    assert unbounded not in value["stdout"].split(), value
    if limit in MEASURE:
        assert (
            bash(BashTool(limits=NO_LIMITS), MEASURE[limit], ws).result["value"]["stdout"] == f"{32 * MiB}\n"
        )


@pytest.mark.parametrize(("limit", "line", "unbounded"), LINES)
def test_negative_control_without_limits_the_same_line_exceeds_them(
    ws: Workspace, limit: str, line: str, unbounded: str
) -> None:
    result = bash(BashTool(limits=NO_LIMITS), line, ws)
    assert not result.is_error, result
    if limit in MEASURE:
        result = bash(BashTool(limits=NO_LIMITS), MEASURE[limit], ws)
    assert result.result["value"]["stdout"].split()[-1] == unbounded, result


class NoCgroupBashTool(BashTool):
    """bash on a machine where the worker cannot create cgroups: rlimits only."""

    @property
    def enforcement(self) -> Enforcement:
        return Enforcement(self.limits, {}, os.geteuid() == 0)


def test_without_cgroups_memory_falls_back_to_an_address_space_limit(ws: Workspace) -> None:
    tool = NoCgroupBashTool(limits=SMALL)
    assert "memory 64 MiB (RLIMIT_AS per process)" in tool.isolation()
    result = bash(tool, "python3 -c 'b = b\"x\" * (160 << 20); print(len(b))'", ws)
    assert result.is_error and "MemoryError" in result.result["value"]["stderr"], result
    assert (
        bash(NoCgroupBashTool(limits=NO_LIMITS), "python3 -c 'b = b\"x\" * (160 << 20)'", ws).is_error
        is False
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="measures what RLIMIT_NPROC does to root")
def test_rlimit_nproc_does_not_bind_root_and_the_worker_says_so(ws: Workspace) -> None:
    tool = NoCgroupBashTool(limits=SMALL)
    assert "processes unbounded (RLIMIT_NPROC 32 does not bind root" in tool.isolation()
    line = LINES[1].values[1]
    result = bash(tool, str(line), ws)
    assert not result.is_error and result.result["value"]["stdout"].strip() == "100", result


def test_the_command_cannot_see_the_report_pipe(ws: Workspace) -> None:
    result = bash(BashTool(limits=SMALL), "ls /proc/$$/fd; true", ws)  # bash stays, ls is its child
    assert not result.is_error, result
    assert result.result["value"]["stdout"].split() == ["0", "1", "2"], result


def test_a_calls_cgroups_are_removed_and_the_limits_are_named(ws: Workspace) -> None:
    tool = BashTool(limits=SMALL)
    assert "limits: memory 64 MiB" in tool.isolation() and "/tmp 16 MiB, file size 32 MiB" in tool.isolation()
    assert not bash(tool, "sleep 0.1 & echo ok", ws).is_error
    mine = f"{CGROUP_PREFIX}{os.getpid()}-"
    left = [c for p in cgroup_parents().values() for c in p.path.iterdir() if c.name.startswith(mine)]
    assert left == []


def test_the_settings_reach_the_bash_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAKA_BASH_MEMORY", "512MiB")
    monkeypatch.setenv("MAKA_BASH_PROCESSES", "64")
    monkeypatch.setenv("MAKA_BASH_TMP_SIZE", "0")
    monkeypatch.setenv("MAKA_BASH_FILE_SIZE", "1GiB")
    settings = load_settings()
    expected = BashLimits(memory_bytes=512 * MiB, processes=64, tmp_bytes=None, file_bytes=1024 * MiB)
    assert settings.bash_limits == expected
    assert settings.runtime_settings().bash_limits == expected
    tool = default_tools(bash_limits=settings.runtime_settings().bash_limits)["bash"]
    assert isinstance(tool, BashTool) and tool.limits == expected
    assert load_settings(bash_memory=0).bash_limits.memory_bytes is None


def test_the_defaults_bound_what_the_attack_used() -> None:
    limits = load_settings().bash_limits
    assert limits == BashLimits()
    # The attack of issue 23: 1.5 GB of memory, 300 processes, 200 MB in /tmp and in the workspace.
    assert limits.memory_bytes and limits.memory_bytes < 1500 * 10**6
    assert limits.processes and limits.processes < 300
    assert limits.tmp_bytes and limits.tmp_bytes < 200 * 10**6
    assert limits.file_bytes and limits.file_bytes < 200 * 10**6


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MAKA_BASH_MEMORY", "lots"),
        ("MAKA_BASH_MEMORY", "1MiB"),
        ("MAKA_BASH_PROCESSES", "-1"),
        ("MAKA_BASH_PROCESSES", "3"),
        ("MAKA_BASH_TMP_SIZE", "-5"),
        ("MAKA_BASH_FILE_SIZE", "10"),
    ],
)
def test_a_bad_limit_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as refused:
        load_settings()
    assert refused.value.code == "config_invalid" and refused.value.detail["setting"] == name


def test_a_bubblewrap_without_size_still_sandboxes_and_says_tmp_is_unbounded(ws: Workspace) -> None:
    """bubblewrap before 0.7 (or setuid) refuses ``--size``: bash still runs, without a sized /tmp."""
    fake = ws.root.parent / "bwrap-without-size"
    fake.write_text(
        "#!/bin/sh\n"
        'for a; do [ "$a" = --size ] && { echo "bwrap: Unknown option --size" >&2; exit 1; }; done\n'
        f'exec {STATUS.bwrap} "$@"\n'
    )
    fake.chmod(0o755)
    tool = BashTool(bwrap=str(fake), limits=SMALL)
    assert tool.sandbox.available and not tool.sandbox.sized_tmp, tool.sandbox
    assert "/tmp unbounded" in tool.isolation()
    result = bash(tool, "head -c 24M /dev/zero > /tmp/x; stat -c %s /tmp/x", ws)
    assert not result.is_error and result.result["value"]["stdout"] == f"{24 * MiB}\n", result
    assert BashTool(limits=SMALL).sandbox.sized_tmp  # the real one here sizes it (negative control)


def test_a_cgroup_that_cannot_be_made_refuses_the_call_before_it_runs(ws: Workspace) -> None:
    class GoneCgroupBashTool(BashTool):
        @property
        def enforcement(self) -> Enforcement:
            gone = CgroupParent(ws.root.parent / "no-such-cgroup", 2)
            return Enforcement(self.limits, {"pids": gone}, os.geteuid() == 0)

    result = bash(GoneCgroupBashTool(limits=SMALL), "echo ran > ran.txt", ws)
    assert result.error_code == "sandbox_unavailable", result
    assert "cgroup" in result.result["value"]["message"], result
    assert not (ws.root / "ran.txt").exists()


def test_the_workersown_cgroups_are_found_on_v1_and_v2(tmp_path: Path) -> None:
    """Read as the kernel writes them; v2 counts only controllers the worker's cgroup delegates."""
    v1_cgroup = "8:pids:/\n4:memory:/svc/worker\n1:cpu:/\n0::/\n"
    v1_mounts = (
        "30 25 0:26 / /sys/fs/cgroup/pids rw,relatime shared:9 - cgroup cgroup rw,pids\n"
        "31 25 0:27 / /sys/fs/cgroup/memory rw,relatime shared:10 - cgroup cgroup rw,memory\n"
        "32 25 0:28 / /sys/fs/cgroup/unified rw,relatime shared:11 - cgroup2 cgroup2 rw\n"
    )
    found = own_cgroups(v1_cgroup, v1_mounts)
    assert found["pids"] == CgroupParent(Path("/sys/fs/cgroup/pids"), 1)
    assert found["memory"] == CgroupParent(Path("/sys/fs/cgroup/memory/svc/worker"), 1)
    worker = tmp_path / "user.slice" / "maka.service"
    worker.mkdir(parents=True)
    (worker / "cgroup.subtree_control").write_text("memory pids\n")
    v2_mounts = f"40 1 0:30 / {tmp_path} rw,nosuid - cgroup2 cgroup2 rw\n"
    assert own_cgroups("0::/user.slice/maka.service\n", v2_mounts) == {
        "memory": CgroupParent(worker, 2),
        "pids": CgroupParent(worker, 2),
    }
    (worker / "cgroup.subtree_control").write_text("cpu\n")
    assert own_cgroups("0::/user.slice/maka.service\n", v2_mounts) == {}
