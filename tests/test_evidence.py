"""File evidence and finalize-only reconciliation: every observation, on real files, never a write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from maka_core.errors import MakaError
from maka_core.facts import canonical_json
from maka_core.facts.codec import canonical_args_hash, digest
from maka_core.tools import FileEvidence, FileIdentity, Tool
from maka_core.tools.registry import default_tools
from maka_core.workspace import Workspace

ROOT = Path(__file__).resolve().parents[1]


def nop() -> None:
    pass


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace.open(tmp_path)


@pytest.fixture
def tools() -> dict[str, Tool]:
    return default_tools()


WRITE = ("write_file", {"path": "conf/app.txt", "content": "port=4000\n"})
EDIT = ("edit_file", {"path": "conf/app.txt", "old_text": "3000", "new_text": "4000"})


def _prepare(
    ws: Workspace, tools: dict[str, Tool], call: tuple[str, dict]
) -> tuple[Tool, dict, FileEvidence]:
    (ws.root / "conf").mkdir(exist_ok=True)
    (ws.root / "conf/app.txt").write_text("port=3000\n")
    name, args = call
    tool = tools[name]
    assert tool.preflight(args, ws) is None
    evidence = tool.capture_evidence(args, ws)
    assert evidence is not None
    return tool, args, evidence


def _snapshot(root: Path) -> dict[str, Any]:
    """Everything a write could change: names, inodes, mtimes, sizes, bytes."""
    out: dict[str, Any] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        data = p.read_bytes() if p.is_file() and not p.is_symlink() else None
        out[str(p)] = (st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode, data)
    return out


# --- evidence ------------------------------------------------------------------------------


@pytest.mark.parametrize("call", [WRITE, EDIT], ids=["write_file", "edit_file"])
def test_evidence_records_before_expected_and_boundaries(ws: Workspace, tools: dict[str, Tool], call) -> None:
    tool, args, evidence = _prepare(ws, tools, call)
    assert evidence.workspace_identity == ws.identity
    assert evidence.target == "conf/app.txt"
    assert evidence.before == FileIdentity.of(b"port=3000\n")
    assert evidence.expected_after == FileIdentity.of(b"port=4000\n")
    assert evidence.transform == f"{tool.name}/v1"
    assert evidence.args_hash == canonical_args_hash(tool.name, args)
    wire = evidence.to_json()
    assert wire["encoding"] == "utf-8" and wire["fileKind"] == "regular" and wire["followSymlinks"] is False
    # The store keeps it as canonical JSON text: it must survive that round trip exactly.
    assert FileEvidence.from_json(canonical_json.loads(canonical_json.dumps(wire))) == evidence


def test_evidence_for_a_new_file_has_no_before(ws: Workspace, tools: dict[str, Tool]) -> None:
    evidence = tools["write_file"].capture_evidence({"path": "new.txt", "content": "x"}, ws)
    assert evidence is not None and evidence.before is None
    assert evidence.to_json()["before"] is None


def test_evidence_target_is_canonical_through_symlinked_dirs(ws: Workspace, tools: dict[str, Tool]) -> None:
    (ws.root / "real").mkdir()
    (ws.root / "alias").symlink_to(ws.root / "real")
    evidence = tools["write_file"].capture_evidence({"path": "alias/./f.txt", "content": "x"}, ws)
    assert evidence is not None and evidence.target == "real/f.txt"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda w: w.pop("argsHash"),
        lambda w: w.update(schema="maka.file_evidence/v2"),
        lambda w: w.update(followSymlinks=True),
        lambda w: w.update(before={"sha256": "sha256:xyz", "size": 1}),
        lambda w: w.update(expectedAfter={"sha256": "sha256:" + "0" * 64, "size": -1}),
        lambda w: w.update(maxBytes=True),
        lambda w: w.update(extra=1),
    ],
)
def test_evidence_from_json_is_strict(ws: Workspace, tools: dict[str, Tool], mutate) -> None:
    _, _, evidence = _prepare(ws, tools, WRITE)
    wire = evidence.to_json()
    mutate(wire)
    with pytest.raises(MakaError) as info:
        FileEvidence.from_json(wire)
    assert info.value.code == "evidence_invalid"


# --- every observation, and no write -------------------------------------------------------


def _reconcile(tool: Tool, args: dict, ws: Workspace, evidence: FileEvidence | None):
    before = _snapshot(ws.root)
    rec = tool.reconcile(args, ws, evidence)
    assert _snapshot(ws.root) == before, "reconcile wrote to the workspace"
    return rec


@pytest.mark.parametrize("call", [WRITE, EDIT], ids=["write_file", "edit_file"])
def test_matches_expected_state_recovers_the_identical_result(
    ws: Workspace, tools: dict[str, Tool], call
) -> None:
    tool, args, evidence = _prepare(ws, tools, call)
    ran = tool.run(args, ws, nop)
    rec = _reconcile(tool, args, ws, evidence)
    assert rec.observation == "matches_expected_state"
    assert rec.recovered == ran  # exactly what run() returned, without running again
    assert rec.observed["state"] == "present"
    assert rec.observation_digest == digest(canonical_json.dumps(rec.observed))


@pytest.mark.parametrize("call", [WRITE, EDIT], ids=["write_file", "edit_file"])
def test_matches_prior_state_when_the_write_never_happened(
    ws: Workspace, tools: dict[str, Tool], call
) -> None:
    tool, args, evidence = _prepare(ws, tools, call)
    rec = _reconcile(tool, args, ws, evidence)
    assert rec.observation == "matches_prior_state" and rec.recovered is None


def test_absent_before_and_still_absent_is_prior_state(ws: Workspace, tools: dict[str, Tool]) -> None:
    args = {"path": "fresh.txt", "content": "x"}
    evidence = tools["write_file"].capture_evidence(args, ws)
    rec = _reconcile(tools["write_file"], args, ws, evidence)
    assert rec.observation == "matches_prior_state" and rec.observed["state"] == "absent"
    tools["write_file"].run(args, ws, nop)
    assert _reconcile(tools["write_file"], args, ws, evidence).observation == "matches_expected_state"


@pytest.mark.parametrize("call", [WRITE, EDIT], ids=["write_file", "edit_file"])
def test_outside_change_is_diverged_and_left_alone(ws: Workspace, tools: dict[str, Tool], call) -> None:
    tool, args, evidence = _prepare(ws, tools, call)
    (ws.root / "conf/app.txt").write_text("port=5000  # changed by someone else\n")
    rec = _reconcile(tool, args, ws, evidence)
    assert rec.observation == "diverged" and rec.recovered is None
    assert (ws.root / "conf/app.txt").read_text() == "port=5000  # changed by someone else\n"


def _replace_with_symlink(ws: Workspace) -> None:
    (ws.root / "conf/other.txt").write_text("port=4000\n")  # even the expected bytes, via a link
    (ws.root / "conf/app.txt").unlink()
    (ws.root / "conf/app.txt").symlink_to(ws.root / "conf/other.txt")


def _replace_with_dir(ws: Workspace) -> None:
    (ws.root / "conf/app.txt").unlink()
    (ws.root / "conf/app.txt").mkdir()


def _redirect_parent(ws: Workspace) -> None:
    (ws.root / "elsewhere").mkdir()
    (ws.root / "elsewhere/app.txt").write_text("port=4000\n")
    (ws.root / "conf/app.txt").unlink()
    (ws.root / "conf").rmdir()
    (ws.root / "conf").symlink_to(ws.root / "elsewhere")


def _grow(ws: Workspace) -> None:
    (ws.root / "conf/app.txt").write_bytes(b"x" * (10 * 1024 * 1024 + 1))


@pytest.mark.parametrize(
    ("change", "state"),
    [
        (lambda ws: (ws.root / "conf/app.txt").unlink(), "absent"),
        (_replace_with_symlink, "symlink"),
        (_replace_with_dir, "not_regular"),
        (_redirect_parent, "symlink"),
        (_grow, "too_large"),
    ],
    ids=["deleted", "symlink", "directory", "symlinked-parent", "over-size-boundary"],
)
def test_unreadable_states_are_never_guessed(
    ws: Workspace, tools: dict[str, Tool], change, state: str
) -> None:
    tool, args, evidence = _prepare(ws, tools, EDIT)
    change(ws)
    rec = _reconcile(tool, args, ws, evidence)
    assert rec.observation == "unreadable" and rec.recovered is None
    assert rec.observed["state"] == state


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads mode-000 files")
def test_permission_denied_is_unreadable(ws: Workspace, tools: dict[str, Tool]) -> None:
    tool, args, evidence = _prepare(ws, tools, EDIT)
    (ws.root / "conf/app.txt").chmod(0)
    try:
        assert _reconcile(tool, args, ws, evidence).observation == "unreadable"
    finally:
        (ws.root / "conf/app.txt").chmod(0o644)


def test_evidence_that_does_not_belong_to_the_call_is_unreadable(
    ws: Workspace, tools: dict[str, Tool], tmp_path: Path
) -> None:
    tool, args, evidence = _prepare(ws, tools, EDIT)
    tool.run(args, ws, nop)  # even with the expected bytes on disk, foreign evidence proves nothing
    other_args = {**args, "new_text": "4001"}
    assert _reconcile(tool, other_args, ws, evidence).observed["field"] == "args_hash"
    assert _reconcile(tools["write_file"], args, ws, evidence).observed["field"] == "tool_name"
    copy = tmp_path / "copy"
    copy.mkdir()
    other_ws = Workspace.open(copy)
    rec = _reconcile(tool, args, other_ws, evidence)
    assert (rec.observation, rec.observed["field"]) == ("unreadable", "workspace_identity")
    missing = _reconcile(tool, args, ws, None)
    assert (missing.observation, missing.observed["state"]) == ("unreadable", "evidence_missing")


def test_read_tools_have_no_reconciler(ws: Workspace, tools: dict[str, Tool]) -> None:
    assert tools["read_file"].reconcile({"path": "x"}, ws, None) is None
    assert tools["list_dir"].reconcile({"path": "."}, ws, None) is None


def test_observation_digest_is_a_function_of_what_was_observed(ws: Workspace, tools: dict[str, Tool]) -> None:
    tool, args, evidence = _prepare(ws, tools, EDIT)
    first = tool.reconcile(args, ws, evidence)
    again = tool.reconcile(args, ws, evidence)
    assert first is not None and again is not None
    assert first.observation_digest == again.observation_digest
    tool.run(args, ws, nop)
    after = tool.reconcile(args, ws, evidence)
    assert after is not None and after.observation_digest != first.observation_digest


# --- a real crash between the effect and T2 ------------------------------------------------

_CHILD = """
import json, sys
from maka_core.workspace import Workspace
from maka_core.tools.registry import default_tools
ws = Workspace.open(sys.argv[1])
tool = default_tools()[sys.argv[2]]
args = json.loads(sys.argv[3])
assert tool.preflight(args, ws) is None
print(json.dumps(tool.capture_evidence(args, ws).to_json()), flush=True)  # "T1"
tool.run(args, ws, lambda: None)
print("T2", flush=True)
"""


@pytest.mark.crash
@pytest.mark.parametrize(
    ("call", "point", "observation"),
    [
        (WRITE, "P3", "matches_prior_state"),
        (WRITE, "P4", "matches_expected_state"),
        (EDIT, "P3", "matches_prior_state"),
        (EDIT, "P4", "matches_expected_state"),
    ],
    ids=["write-P3", "write-P4", "edit-P3", "edit-P4"],
)
def test_sigkilled_tool_is_settled_from_its_evidence(
    ws: Workspace, tools: dict[str, Tool], call, point: str, observation: str
) -> None:
    name, args = call
    (ws.root / "conf").mkdir()
    (ws.root / "conf/app.txt").write_text("port=3000\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKA_FAILPOINT")}
    env |= {"MAKA_FAILPOINT": point, "MAKA_FAILPOINT_TAG": name}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(ws.root), name, json.dumps(args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1  # evidence out, no T2
    evidence = FileEvidence.from_json(json.loads(lines[0]))
    rec = _reconcile(tools[name], args, Workspace.open(ws.root, create=False), evidence)
    assert rec.observation == observation
    expected_text = "port=4000\n" if observation == "matches_expected_state" else "port=3000\n"
    assert (ws.root / "conf/app.txt").read_text() == expected_text
