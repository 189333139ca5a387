"""Phase 4 wired: a run's terminal fact binds a checkpoint of its Git workspace, the continuation gate
reads it, and the operator's isolated restore and rebaseline are facts.

Real SQLite ledgers, real Git repositories (untracked, ignored, binary files, a symlink, a dirty
index), the turn protocol through the same ``maka_core.runtime`` functions the activities call,
and real SIGKILLs at each new commit point in a child process.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from maka_core.checkpoints import CheckpointBundle, GitCheckpointProvider, SourceBoundary
from maka_core.errors import MakaError
from maka_core.runtime import model_step, tool_call, turn, workspace_continuity
from maka_core.runtime.continuation import ResumeDecision, resume_session
from maka_core.runtime.contracts import BeginRunInput, FinishRunInput, ModelStepInput, RunIds, ToolInput
from maka_core.runtime.inspect import inspect_host
from maka_core.runtime.runtime import Attempt, Runtime, RuntimeSettings
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace

SID = "s1"
IDS = RunIds(session_id=SID, turn_id="t1", run_id="r1", invocation_id="i1")
WF = "maka-session-s1"
ROOT = Path(__file__).resolve().parent.parent
SCRIPT = {
    "kind": "script",
    "steps": [
        {"toolCalls": [{"name": "write_file", "args": {"path": "notes.txt", "content": "by the model\n"}}]}
    ],
}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def git(root: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env |= {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@x",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@x",
    }
    return subprocess.run(
        ["git", *args], cwd=root, env=env, check=True, capture_output=True, text=True
    ).stdout


def make_repo(root: Path) -> Workspace:
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / ".gitignore").write_text("build/\n")
    (root / "src.py").write_text("print('v1')\n")
    (root / "logo.bin").write_bytes(bytes(range(256)))
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "init")
    (root / "untracked.txt").write_text("u\n")
    (root / "build").mkdir()
    (root / "build" / "out.o").write_bytes(b"\0ignored")
    os.symlink("src.py", root / "link.py")
    (root / "src.py").write_text("print('v2 staged')\n")
    git(root, "add", "src.py")  # a dirty index
    return Workspace.open(root)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Workspace:
    return make_repo(tmp_path / "proj")


@pytest.fixture
def rt(tmp_path: Path, home: Path) -> Iterator[Runtime]:
    runtime = Runtime(LedgerStore.open(tmp_path / "ledger.sqlite"), settings=RuntimeSettings(maka_home=home))
    yield runtime
    runtime.close()
    runtime.ledger.close()  # type: ignore[attr-defined]


def provider_of(home: Path) -> GitCheckpointProvider:
    return workspace_continuity.provider_at(home)


def parked_turn(rt: Runtime, ws: Workspace, ids: RunIds = IDS, **config: Any) -> None:
    """A turn that wrote a file, then ended parked (its execution closed): a resumable boundary."""
    run(
        turn.begin_run(
            rt,
            BeginRunInput(
                ids=ids, text="do it", ts=1, workflow_id=WF, workflow_run_id="wr", task_queue="q",
                workspace=str(ws.root), workspace_identity=ws.identity, provider=SCRIPT, **config,
            ),
        )
    )  # fmt: skip
    out = run(
        model_step.model_step(rt, ModelStepInput(ids=ids, step=0, workspace=str(ws.root), provider=SCRIPT))
    )
    for call in out.calls:
        tin = ToolInput(
            session_id=SID,
            run_id=ids.run_id,
            call=call,
            workspace=str(ws.root),
            workspace_identity=ws.identity,
        )
        run(tool_call.execute_tool(rt, tin, Attempt()))
    finish = FinishRunInput(ids=ids, status="failed", ts=50, park_reason="max_steps_exceeded")
    run(turn.finish_run(rt, finish))


def resume(rt: Runtime, home: Path, **kw: Any) -> ResumeDecision:
    return resume_session(
        rt.ledger,  # type: ignore[arg-type]
        SID,
        workflow_id=WF,
        inspect=kw.pop("inspect", lambda cwd: inspect_host(cwd, rt.tools.keys())),
        checkpoints=kw.pop("checkpoints", provider_of(home)),
        **kw,
    )


def terminal_bundle(rt: Runtime, run_id: str = "r1") -> CheckpointBundle | None:
    terminal = next(e for e in rt.ledger.events(run_id=run_id) if e.is_terminal)
    return workspace_continuity.bundle_of(terminal)


def user_state(root: Path) -> tuple[str, ...]:
    git_dir = root / ".git"
    return (
        git(root, "status", "--porcelain=v2", "--branch", "--untracked-files=all"),
        (git_dir / "index").read_bytes().hex(),
        git(root, "for-each-ref"),
        git(root, "stash", "list"),
        git(root, "reflog", "--all") if (git_dir / "logs").exists() else "",
    )


# --- capture at the terminal fact ---------------------------------------------------------------


def test_the_terminal_fact_carries_a_verified_checkpoint_and_the_users_repository_is_untouched(
    rt: Runtime, repo: Workspace, home: Path
) -> None:
    before = user_state(repo.root)
    parked_turn(rt, repo)
    assert user_state(repo.root)[1:] == before[1:]  # index, refs, stash, reflog byte-for-byte
    bundle = terminal_bundle(rt)
    assert bundle is not None and bundle.checkpoint is not None
    run_events = rt.ledger.events(run_id="r1")
    assert bundle.boundary.immutable_runtime_high_water == len(run_events) - 1  # the prefix it closes
    assert bundle.boundary.workspace_identity == repo.identity and bundle.boundary.workspace_epoch == 0
    provider = provider_of(home)
    assert provider.verify(repo, bundle.checkpoint).verified
    store = f"--git-dir={provider.store(repo)}"
    listed = ["git", store, "ls-tree", "-r", "--name-only", bundle.checkpoint.commit]
    names = subprocess.run(listed, check=True, capture_output=True, text=True).stdout.split()
    assert sorted(names) == [".gitignore", "link.py", "logo.bin", "notes.txt", "src.py", "untracked.txt"]


def test_a_workspace_without_git_records_why_and_resumes_exactly_as_today(
    rt: Runtime, tmp_path: Path, home: Path
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    ws = Workspace.open(plain)
    parked_turn(rt, ws)
    bundle = terminal_bundle(rt)
    assert bundle is not None and bundle.checkpoint is None and bundle.no_checkpoint is not None
    assert bundle.no_checkpoint.code == "workspace_not_git"
    assert not (home / "checkpoints" / "git").exists()  # nothing written for it
    (plain / "notes.txt").write_text("edited outside\n")
    with_gate = resume(rt, home)
    assert with_gate.decision == "continue", with_gate.to_json()


# --- the gate --------------------------------------------------------------------------------


def test_an_outside_edit_while_parked_parks_with_workspace_content_changed_and_names_the_paths(
    rt: Runtime, repo: Workspace, home: Path
) -> None:
    parked_turn(rt, repo)
    (repo.root / "src.py").write_text("print('teammate')\n")
    (repo.root / "new.txt").write_text("secret-content\n")
    (repo.root / "build" / "more.o").write_bytes(b"ignored still")
    decision = resume(rt, home)
    assert decision.decision == "park" and decision.rejection_reasons == ("workspace_content_changed",)
    diag = next(d for d in decision.diagnostics if d["code"] == "workspace_content_changed")
    assert diag["detail"]["changedPaths"] == {"added": ["new.txt"], "modified": ["src.py"]}
    assert "secret-content" not in repr(decision.to_json())  # names, never contents
    assert not rt.ledger.session_claims(SID)  # type: ignore[attr-defined]


def test_negative_control_without_the_gate_the_same_edit_continues(
    rt: Runtime, repo: Workspace, home: Path
) -> None:
    parked_turn(rt, repo)
    (repo.root / "src.py").write_text("print('teammate')\n")
    decision = resume(rt, home, checkpoints=None)  # today's planner: the marker only
    assert decision.decision == "continue"


def test_an_unchanged_workspace_continues(rt: Runtime, repo: Workspace, home: Path) -> None:
    parked_turn(rt, repo)
    decision = resume(rt, home)
    assert decision.decision == "continue", decision.to_json()


def test_a_committed_boundary_whose_ref_is_gone_fails_closed(
    rt: Runtime, repo: Workspace, home: Path
) -> None:
    parked_turn(rt, repo)
    bundle = terminal_bundle(rt)
    assert bundle is not None and bundle.checkpoint is not None
    provider = provider_of(home)
    subprocess.run(
        ["git", f"--git-dir={provider.store(repo)}", "update-ref", "-d", bundle.checkpoint.ref], check=True
    )
    decision = resume(rt, home)
    assert decision.decision == "park" and decision.rejection_reasons == ("checkpoint_missing",)


def test_revalidation_parks_an_edit_made_between_the_plan_and_the_claim(
    rt: Runtime, repo: Workspace, home: Path
) -> None:
    parked_turn(rt, repo)
    calls = {"n": 0}

    def inspect(cwd: str) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # the revalidation's observation: someone edits right now
            (repo.root / "src.py").write_text("print('raced')\n")
        return inspect_host(cwd, rt.tools.keys())

    decision = resume(rt, home, inspect=inspect)
    assert decision.decision == "park" and "workspace_content_changed" in decision.rejection_reasons
    assert not rt.ledger.session_claims(SID)  # type: ignore[attr-defined]


# --- operator choices ------------------------------------------------------------------------


def test_rebaseline_commits_a_new_epoch_and_the_session_continues_with_a_note(
    rt: Runtime, repo: Workspace, home: Path
) -> None:
    parked_turn(rt, repo)
    (repo.root / "src.py").write_text("print('teammate')\n")
    provider = provider_of(home)
    recorded = workspace_continuity.rebaseline(rt.ledger, provider, SID)  # type: ignore[arg-type]
    assert recorded["workspaceEpoch"] == 1 and recorded["changedPaths"] == {"modified": ["src.py"]}
    note = workspace_continuity.rebaseline_note(recorded)
    assert note is not None and "src.py (modified)" in note
    assert (repo.root / "src.py").read_text() == "print('teammate')\n"  # the user's files as they are
    decision = resume(rt, home)
    assert decision.decision == "continue", decision.to_json()
    from maka_core.runtime.compaction import history_view

    sent = history_view(rt.ledger.events(session_id=SID)).sent  # what the continuation's step sends
    texts = [e.content.text for e in sent if e.content is not None and e.content.kind == "text"]
    assert texts[-1] == note  # the model is told which paths to re-read


def test_an_operator_choice_commits_its_fact_and_its_run_header_in_one_transaction(
    rt: Runtime, repo: Workspace, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The choice's run has no workflow to begin it: its header is written with its one fact, as a
    resolution's and a limit raise's are (``resolution.operator_fact``). Were the header a second
    write, a kill between the two would leave ``run_header_missing``: here the second write fails
    instead, and the old two-step commit is the control."""
    parked_turn(rt, repo)
    (repo.root / "src.py").write_text("print('teammate')\n")

    def no_second_write(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("killed between the fact and its header")

    monkeypatch.setattr(rt.ledger, "put_run", no_second_write)
    recorded = workspace_continuity.rebaseline(rt.ledger, provider_of(home), SID)  # type: ignore[arg-type]
    monkeypatch.undo()
    fact = next(e for e in rt.ledger.events(session_id=SID) if workspace_continuity.transition_of(e))
    assert recorded["workspaceEpoch"] == 1
    header = rt.ledger.get_run(fact.run_id)
    assert header is not None and header.status == "completed" and header.turn_id == fact.turn_id

    # Control: the old shape, the fact then its header in two writes, leaves the fact headerless.
    from maka_core.runtime.resolution import operator_fact

    event, old_header = operator_fact(SID, name="workspace", key="x", payload={}, now=1)
    rt.ledger.commit_terminal(event)
    monkeypatch.setattr(rt.ledger, "put_run", no_second_write)
    with pytest.raises(RuntimeError):
        rt.ledger.put_run(old_header)
    monkeypatch.undo()
    assert rt.ledger.get_run(event.run_id) is None


def test_isolated_restore_materializes_beside_the_workspace_and_never_writes_the_users_folder(
    rt: Runtime, repo: Workspace, home: Path
) -> None:
    parked_turn(rt, repo)
    (repo.root / "src.py").write_text("print('teammate')\n")
    before = user_state(repo.root), (repo.root / "src.py").read_bytes()
    provider = provider_of(home)
    recorded = workspace_continuity.restore_isolated(rt.ledger, provider, SID)  # type: ignore[arg-type]
    dest = Path(recorded["cwd"])
    assert dest.parent == repo.root.parent and dest.name == "proj.restored-1"
    assert (dest / "src.py").read_text() == "print('v2 staged')\n"  # the boundary's contents
    assert (dest / "notes.txt").read_text() == "by the model\n" and os.readlink(dest / "link.py") == "src.py"
    assert not (dest / "build").exists()  # ignored files were never captured
    assert recorded["workspaceIdentity"] != repo.identity and recorded["treeMatches"] is True
    assert (user_state(repo.root), (repo.root / "src.py").read_bytes()) == before
    decision = resume(rt, home)
    assert decision.decision == "continue", decision.to_json()
    header = rt.ledger.session_claims(SID)[0].target_run_header_json  # type: ignore[attr-defined]
    assert header["cwd"] == str(dest) and header["workspaceIdentity"] == recorded["workspaceIdentity"]


def test_operator_choices_refuse_a_boundary_without_a_checkpoint(
    rt: Runtime, tmp_path: Path, home: Path
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    parked_turn(rt, Workspace.open(plain))
    from maka_core.errors import MakaError

    for choice in (workspace_continuity.rebaseline, workspace_continuity.restore_isolated):
        with pytest.raises(MakaError) as refused:
            choice(rt.ledger, provider_of(home), SID)  # type: ignore[arg-type]
        assert refused.value.code == "workspace_has_no_checkpoint"


# --- retention -------------------------------------------------------------------------------


def test_gc_keeps_every_referenced_ref_and_collects_an_orphan(
    rt: Runtime, repo: Workspace, home: Path
) -> None:
    parked_turn(rt, repo)
    provider = provider_of(home)
    orphan = provider.capture(repo, SID)  # an artifact whose fact never committed
    assert not isinstance(orphan, type(None)) and hasattr(orphan, "ref")
    bundle = terminal_bundle(rt)
    assert bundle is not None and bundle.checkpoint is not None
    young = workspace_continuity.gc_checkpoints(rt.ledger, provider)  # type: ignore[arg-type]
    assert young["deleted"] == 0  # within the grace period nothing goes
    out = workspace_continuity.gc_checkpoints(rt.ledger, provider, grace_seconds=0)  # type: ignore[arg-type]
    assert out["deleted"] == 1 and out["stores"][0]["deleted"] == [orphan.ref]  # type: ignore[union-attr]
    assert provider.verify(repo, bundle.checkpoint).verified
    assert resume(rt, home).decision == "continue"


def test_gc_whose_repack_fails_after_deleting_still_reports_what_it_deleted(
    rt: Runtime, repo: Workspace, home: Path, tmp_path: Path
) -> None:
    """The refs are gone once ``update-ref`` ran: a repack that fails afterwards is logged, and the
    report names the deleted refs (it said ``skipped`` with ``deleted: []``; the old ``_gc`` fails
    this test)."""
    parked_turn(rt, repo)
    orphan = provider_of(home).capture(repo, SID)
    assert hasattr(orphan, "ref")
    wrapper = tmp_path / "git-without-gc"
    wrapper.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do [ "$a" = gc ] && { echo "fatal: repack failed" >&2; exit 128; }; done\n'
        'exec git "$@"\n'
    )
    wrapper.chmod(0o755)
    failing = GitCheckpointProvider(home / "checkpoints", git=str(wrapper))
    assert failing.state_dir == provider_of(home).state_dir
    out = workspace_continuity.gc_checkpoints(rt.ledger, failing, grace_seconds=0)  # type: ignore[arg-type]
    assert out["deleted"] == 1 and out["stores"][0]["deleted"] == [orphan.ref], out  # type: ignore[union-attr]
    assert "skipped" not in out["stores"][0], out
    again = workspace_continuity.gc_checkpoints(rt.ledger, failing, grace_seconds=0)  # type: ignore[arg-type]
    assert again["deleted"] == 0 and "skipped" not in again["stores"][0], again  # nothing due: no repack
    assert not failing.refs(repo) or orphan.ref not in failing.refs(repo)  # type: ignore[union-attr]


class _CountingReads(LedgerStore):
    """A store that counts whole-ledger reads (``events()`` with no session)."""

    whole_reads = 0

    def events(self, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs.get("session_id"):
            self.whole_reads += 1
        return super().events(*args, **kwargs)


def test_gc_over_young_refs_does_not_read_the_whole_ledger(
    tmp_path: Path, repo: Workspace, home: Path
) -> None:
    """A worker start runs gc: with no ref past its grace nothing can go, so the ledger is not read."""
    provider = provider_of(home)
    provider.capture(repo, SID)
    with _CountingReads.open(tmp_path / "count.sqlite") as store:
        assert workspace_continuity.gc_checkpoints(store, provider)["deleted"] == 0
        assert store.whole_reads == 0
        # Control: once a ref is past the grace, the ledger is read for the keep set (and the ref,
        # of a session this empty ledger does not hold, is kept as another ledger's).
        assert workspace_continuity.gc_checkpoints(store, provider, grace_seconds=0)["deleted"] == 0
        assert store.whole_reads == 1


def test_gc_against_another_ledger_on_the_same_home_keeps_this_ledgers_refs(
    tmp_path: Path, rt: Runtime, repo: Workspace, home: Path
) -> None:
    parked_turn(rt, repo)
    provider = provider_of(home)
    bundle = terminal_bundle(rt)
    assert bundle is not None and bundle.checkpoint is not None
    other = LedgerStore.open(tmp_path / "b.sqlite")  # `maka worker --db b.sqlite`, same MAKA_HOME
    try:
        own_orphan = provider.capture(repo, "b-session")
        out = workspace_continuity.gc_checkpoints(other, provider, grace_seconds=0)
        assert out["deleted"] == 0, out
        assert provider.verify(repo, bundle.checkpoint).verified
        assert resume(rt, home).decision == "continue"
        # Negative control: today's keep set (the refs ledger B's facts name) alone deletes both.
        handle = Workspace(root=repo.root, identity=repo.identity)
        keep_b = workspace_continuity.referenced_refs(other.events())
        kept_b = keep_b.get(repo.identity.removeprefix("workspace:v1:"), set())
        gone = provider.gc(handle, kept_b, grace_seconds=0)
        assert bundle.checkpoint.ref in gone and getattr(own_orphan, "ref", None) in gone
    finally:
        other.close()


def test_gc_keeps_the_ref_of_a_bundle_it_cannot_decode(rt: Runtime, repo: Workspace, home: Path) -> None:
    parked_turn(rt, repo)
    events = rt.ledger.events(session_id=SID)
    terminal = next(e for e in events if e.is_terminal)
    assert terminal.actions is not None and terminal.actions.state_delta is not None
    delta = dict(terminal.actions.state_delta)
    wire = {**delta["workspaceCheckpoint"], "futureField": 1}  # a newer writer's bundle
    actions = terminal.actions.model_copy(update={"state_delta": {**delta, "workspaceCheckpoint": wire}})
    newer = [*(e for e in events if not e.is_terminal), terminal.model_copy(update={"actions": actions})]
    ref = wire["checkpoint"]["ref"]
    workspace_id = repo.identity.removeprefix("workspace:v1:")
    keep = workspace_continuity.referenced_refs(newer)
    assert keep == {workspace_id: {ref}}
    provider = provider_of(home)
    assert provider.gc(repo, keep[workspace_id], grace_seconds=0) == ()
    # Negative control: today's keep set (only what the strict decoder reads) deletes it.
    strict = {b.checkpoint.ref for _, b in workspace_continuity.session_bundles(newer) if b.checkpoint}
    assert provider.gc(repo, strict, grace_seconds=0) == (ref,)


def test_the_gate_finds_the_capturing_store_whatever_maka_home_the_resuming_process_has(
    tmp_path: Path, rt: Runtime, repo: Workspace, home: Path
) -> None:
    parked_turn(rt, repo)
    bundle = terminal_bundle(rt)
    assert bundle is not None and bundle.checkpoint is not None
    assert bundle.checkpoint.store == str(home / "checkpoints")
    operator = tmp_path / "operator_home"
    operator.mkdir()
    assert resume(rt, home, checkpoints=provider_of(operator)).decision == "continue"
    # An older bundle (no store recorded), read from another MAKA_HOME: the store is elsewhere,
    # its own code (resume on the workspace's host), not a checkpoint that is gone for good.
    events = rt.ledger.events(session_id=SID)
    old = bundle.model_copy(update={"checkpoint": bundle.checkpoint.model_copy(update={"store": None})})
    assert "store" not in old.to_wire()["checkpoint"]
    events = [workspace_continuity.with_bundle(e, old) if e.is_terminal else e for e in events]
    continuity = workspace_continuity.source_continuity(events, "r1")
    seen = workspace_continuity.observe_source(provider_of(operator), str(repo.root), continuity)
    assert seen is not None and seen.code == "checkpoint_store_unavailable", seen
    # Control: the same old bundle on the capturing home still matches.
    same = workspace_continuity.observe_source(provider_of(home), str(repo.root), continuity)
    assert same is not None and same.code == "workspace_matches_checkpoint", same


@pytest.mark.parametrize("finisher", ["box-b", "box-a"])
def test_a_run_that_ends_on_another_host_than_the_workspaces_captures_nothing(
    tmp_path: Path, repo: Workspace, home: Path, finisher: str
) -> None:
    """The run's end runs on the shared queue: on a worker of another host, a folder with the same
    path is not the session's, so no capture (the gate passes, as without Git); control: on the
    session's host (box-a) the same run is captured and the edit parks."""
    settings = RuntimeSettings(maka_home=home, host=finisher)
    runtime = Runtime(LedgerStore.open(tmp_path / "ledger.sqlite"), settings=settings)
    try:
        parked_turn(runtime, repo, host="box-a")
        bundle = terminal_bundle(runtime)
        assert bundle is not None
        (repo.root / "src.py").write_text("edited while parked\n")
        decision = resume(runtime, home)
        if finisher == "box-b":
            assert bundle.no_checkpoint is not None and bundle.checkpoint is None
            assert bundle.no_checkpoint.code == "checkpoint_host_elsewhere"
            assert provider_of(home).refs(repo) == {}
            assert decision.decision == "continue", decision
        else:
            assert bundle.checkpoint is not None
            assert decision.rejection_reasons == ("workspace_content_changed",)
    finally:
        runtime.close()
        runtime.ledger.close()  # type: ignore[attr-defined]


# --- SIGKILL at each new commit point -------------------------------------------------------------

#: The commit points wiring added (``test_git_checkpoints`` checks every checkpoint point is drilled).
WIRED_POINTS = (
    "checkpoint_boundary_committed",
    "checkpoint_rebaseline_captured",
    "checkpoint_restore_materialized",
)

CHILD = r"""
import asyncio, sys
from pathlib import Path
sys.path.insert(0, {root!r})
from maka_core.runtime import workspace_continuity
from maka_core.runtime.runtime import Runtime, RuntimeSettings
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from tests.test_workspace_continuity import parked_turn
home = Path({home!r})
rt = Runtime(LedgerStore.open({db!r}), settings=RuntimeSettings(maka_home=home))
phase = {phase!r}
if phase == "turn":
    parked_turn(rt, Workspace.open({ws!r}, create=False))
elif phase == "rebaseline":
    workspace_continuity.rebaseline(rt.ledger, workspace_continuity.provider_at(home), "s1")
else:
    workspace_continuity.restore_isolated(rt.ledger, workspace_continuity.provider_at(home), "s1")
print("survived")
"""


def child(
    tmp_path: Path, home: Path, ws: Workspace, phase: str, point: str | None
) -> subprocess.CompletedProcess[str]:
    code = CHILD.format(
        root=str(ROOT), home=str(home), db=str(tmp_path / "ledger.sqlite"), ws=str(ws.root), phase=phase
    )
    env = {**os.environ, "MAKA_FAILPOINT": point or ""}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "expect"),
    [
        # artifact stored, fact not committed: the run is lost (no bundle); the ref is an orphan gc collects
        ("checkpoint_capture_after_ref", "orphan"),
        # the fact with its bundle committed, the header lagging: repair follows the fact, the gate holds
        ("checkpoint_boundary_committed", "bound"),
        (None, "bound"),  # the control: no crash
    ],
)
def test_sigkill_around_the_boundary_fact_leaves_an_orphan_or_a_whole_fact(
    tmp_path: Path, home: Path, repo: Workspace, point: str | None, expect: str
) -> None:
    LedgerStore.open(tmp_path / "ledger.sqlite").close()
    proc = child(tmp_path, home, repo, "turn", point)
    assert (proc.returncode == -9) == (point is not None), proc.stderr[-2000:]
    store = LedgerStore.open(tmp_path / "ledger.sqlite")
    rt = Runtime(store, settings=RuntimeSettings(maka_home=home))
    try:
        from maka_core.runtime.settle import repair_all

        repair_all(store)
        provider = provider_of(home)
        refs = provider.refs(repo)
        terminal = next(e for e in store.events(run_id="r1") if e.is_terminal)
        bundle = workspace_continuity.bundle_of(terminal)
        if expect == "orphan":
            assert bundle is None and len(refs) == 1  # nothing half-visible: no fact names the ref
            assert workspace_continuity.gc_checkpoints(store, provider, grace_seconds=0)["deleted"] == 1
            assert provider.refs(repo) == {}
        else:
            assert bundle is not None and bundle.checkpoint is not None
            assert set(refs) == {bundle.checkpoint.ref}
            header = store.get_run("r1")
            assert header is not None and header.is_terminal
            (repo.root / "src.py").write_text("edited after the crash\n")
            decision = resume(rt, home)
            assert decision.rejection_reasons == ("workspace_content_changed",)
            assert workspace_continuity.gc_checkpoints(store, provider, grace_seconds=0)["deleted"] == 0
    finally:
        rt.close()
        store.close()


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["rebaseline", "restore"])
@pytest.mark.parametrize("killed", [True, False])
def test_sigkill_during_an_operator_choice_leaves_the_session_parked_or_the_choice_whole(
    tmp_path: Path, home: Path, repo: Workspace, phase: str, killed: bool
) -> None:
    LedgerStore.open(tmp_path / "ledger.sqlite").close()
    assert child(tmp_path, home, repo, "turn", None).returncode == 0
    (repo.root / "src.py").write_text("print('teammate')\n")
    point = {"rebaseline": "checkpoint_rebaseline_captured", "restore": "checkpoint_restore_materialized"}[
        phase
    ]
    proc = child(tmp_path, home, repo, phase, point if killed else None)
    assert (proc.returncode == -9) == killed, proc.stderr[-2000:]
    store = LedgerStore.open(tmp_path / "ledger.sqlite")
    rt = Runtime(store, settings=RuntimeSettings(maka_home=home))
    try:
        transitions = [
            t for e in store.events(session_id=SID) if (t := workspace_continuity.transition_of(e))
        ]
        decision = resume(rt, home)
        if killed:  # no fact: nothing half-visible, the session still parks with the stable reason
            assert transitions == [] and decision.rejection_reasons == ("workspace_content_changed",)
            assert (repo.root / "src.py").read_text() == "print('teammate')\n"
        else:
            assert len(transitions) == 1 and decision.decision == "continue", decision.to_json()
    finally:
        rt.close()
        store.close()


# --- audit --------------------------------------------------------------------------------------


def test_the_audit_shows_each_checkpoint_restore_and_rebaseline_beside_its_run(
    rt: Runtime, repo: Workspace, home: Path
) -> None:
    from maka_core.audit.model import read_ledger
    from maka_core.audit.report import audit
    from maka_core.audit.text import report_lines

    parked_turn(rt, repo)
    (repo.root / "src.py").write_text("print('teammate')\n")
    provider = provider_of(home)
    workspace_continuity.rebaseline(rt.ledger, provider, SID)  # type: ignore[arg-type]
    workspace_continuity.restore_isolated(rt.ledger, provider, SID)  # type: ignore[arg-type]
    report = audit(read_ledger(rt.ledger, SID, checkpoints=provider), []).to_json()
    by_run = {r["runId"]: r for r in report["runs"]}
    assert by_run["r1"]["workspaceCheckpoint"]["checkpointRef"] == "refs/maka/checkpoints/s1/1"
    kinds = [r["workspaceTransition"]["kind"] for r in report["runs"] if "workspaceTransition" in r]
    assert kinds == ["rebaseline", "isolated_restore"]
    checks = {f["check"] for f in report["findings"]}
    assert "checkpoint_ref_missing" not in checks
    assert not any(
        f["runId"] in by_run and "workspaceTransition" in by_run[f["runId"]]
        for f in report["findings"]
        if f.get("runId")
    )
    text = "\n".join(report_lines(report))
    assert "workspace boundary: refs/maka/checkpoints/s1/1  epoch 0" in text
    assert "rebaseline from refs/maka/checkpoints/s1/1 epoch 1  changed: src.py" in text
    assert "isolated_restore from" in text and "proj.restored-1" in text
    # A committed boundary whose artifact is gone is drift (the control above had none).
    store = f"--git-dir={provider.store(repo)}"
    subprocess.run(["git", store, "update-ref", "-d", "refs/maka/checkpoints/s1/1"], check=True)
    again = audit(read_ledger(rt.ledger, SID, checkpoints=provider), []).to_json()
    missing = [f for f in again["findings"] if f["check"] == "checkpoint_ref_missing"]
    assert len(missing) == 1 and "refs/maka/checkpoints/s1/1" in missing[0]["message"]


@pytest.mark.parametrize("store_inside", [True, False])
def test_a_failed_capture_has_its_own_code_the_gate_passes_and_the_audit_notices(
    tmp_path: Path, repo: Workspace, store_inside: bool
) -> None:
    from maka_core.audit.model import read_ledger
    from maka_core.audit.report import audit

    home = tmp_path / "home2"
    home.mkdir()
    if store_inside:  # a real failure: MAKA_HOME/checkpoints resolves into the workspace
        (repo.root / "cpstore").mkdir()
        os.symlink(repo.root / "cpstore", home / "checkpoints")
    runtime = Runtime(LedgerStore.open(tmp_path / "ledger.sqlite"), settings=RuntimeSettings(maka_home=home))
    try:
        parked_turn(runtime, repo)
        bundle = terminal_bundle(runtime)
        assert bundle is not None
        report = audit(read_ledger(runtime.ledger, SID, checkpoints=provider_of(home)), []).to_json()
        notices = [f for f in report["findings"] if f["check"] == "checkpoint_capture_failed"]
        if store_inside:
            assert bundle.no_checkpoint is not None
            assert bundle.no_checkpoint.code == "checkpoint_capture_failed", bundle
            assert "checkpoint_store_inside_workspace" in bundle.no_checkpoint.detail
            assert [(n["severity"], n["runId"]) for n in notices] == [("notice", "r1")]
            assert resume(runtime, home).decision == "continue"  # passed, as today
        else:
            assert bundle.checkpoint is not None and notices == []
    finally:
        runtime.close()
        runtime.ledger.close()  # type: ignore[attr-defined]


def test_gc_at_worker_start_logs_an_os_error_and_goes_on(rt: Runtime, repo: Workspace, home: Path) -> None:
    parked_turn(rt, repo)
    provider = provider_of(home)
    bundle = terminal_bundle(rt)
    assert bundle is not None and bundle.checkpoint is not None
    store = provider.store(repo)
    old = {"GIT_COMMITTER_DATE": "1000000000 +0000", "GIT_AUTHOR_DATE": "1000000000 +0000"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | old
    env |= {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@x",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@x",
    }
    cmd = ["git", f"--git-dir={store}"]
    commit = subprocess.run(
        [*cmd, "commit-tree", "-m", "orphan", bundle.checkpoint.tree],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    subprocess.run([*cmd, "update-ref", "refs/maka/checkpoints/s1/9", commit], env=env, check=True)
    lock = store.parent / f"{repo.workspace_id}.lock"
    lock.unlink(missing_ok=True)
    lock.mkdir()  # an OSError (IsADirectoryError) when retention takes the store's lock
    out = workspace_continuity.gc_quietly(rt.ledger, home)  # type: ignore[arg-type]
    assert out is not None and out["stores"][0]["skipped"] == "checkpoint_store_unreadable", out
    # Control: the store's own gc raises (what stopped startup repair); gc skips that store.
    with pytest.raises(OSError):
        provider.gc(repo, (), grace_seconds=0)


@pytest.mark.parametrize("git_binary", ["/nonexistent/git", "git"])
def test_a_restore_whose_git_init_fails_is_restore_failed_and_leaves_no_folder(
    tmp_path: Path, rt: Runtime, repo: Workspace, home: Path, git_binary: str
) -> None:
    parked_turn(rt, repo)
    (repo.root / "src.py").write_text("edited\n")
    provider = provider_of(home)
    if git_binary != "git":
        with pytest.raises(MakaError) as refused:
            workspace_continuity.restore_isolated(rt.ledger, provider, SID, git=git_binary)  # type: ignore[arg-type]
        assert refused.value.code == "restore_failed"
        assert not (tmp_path / "proj.restored-1").exists()
        assert resume(rt, home).rejection_reasons == ("workspace_content_changed",)  # still parked
    else:  # control: the same restore with a working git makes the folder
        workspace_continuity.restore_isolated(rt.ledger, provider, SID, git=git_binary)  # type: ignore[arg-type]
        assert (tmp_path / "proj.restored-1" / ".git").is_dir()


def test_a_capture_over_its_time_budget_records_why_and_creates_no_ref(
    tmp_path: Path, repo: Workspace, home: Path
) -> None:
    for i in range(300):  # files no cache vouches for: the budget is checked between them
        (repo.root / f"gen{i}.txt").write_text(f"{i}\n")
    provider = provider_of(home)
    boundary = SourceBoundary(
        workspace_identity=repo.identity,
        immutable_runtime_high_water=1,
        immutable_runtime_digest="sha256:" + "0" * 64,
    )
    slow = workspace_continuity.capture_bundle(provider, repo, SID, boundary, 0, budget_s=0.0)
    assert slow.no_checkpoint is not None and slow.no_checkpoint.code == "checkpoint_budget_exceeded"
    assert provider.refs(repo) == {}
    # Control: the default budget (CAPTURE_BUDGET_S, well under the ledger's timeout) captures it.
    assert workspace_continuity.CAPTURE_BUDGET_S < 10.0
    fast = workspace_continuity.capture_bundle(
        provider, repo, SID, boundary, 0, budget_s=workspace_continuity.CAPTURE_BUDGET_S
    )
    assert fast.checkpoint is not None and fast.checkpoint.file_count >= 300
    assert list(provider.refs(repo)) == [fast.checkpoint.ref]


@pytest.mark.parametrize("choice", ["rebaseline", "isolated_restore"])
def test_session_show_renders_an_operator_workspace_choice_as_an_operator_line(
    rt: Runtime, repo: Workspace, home: Path, choice: Any
) -> None:
    from maka_core.runtime.session_view import transcript_lines

    parked_turn(rt, repo)
    (repo.root / "src.py").write_text("edited\n")
    before = transcript_lines(rt.ledger.events(session_id=SID))
    workspace_continuity.choose(rt.ledger, provider_of(home), SID, choice)  # type: ignore[arg-type]
    after = transcript_lines(rt.ledger.events(session_id=SID))
    assert after[: len(before)] == before
    added = after[len(before) :]
    assert len(added) == 1 and added[0].startswith("-- operator "), added
    expected = "rebaseline from refs/maka/checkpoints/s1/1" if choice == "rebaseline" else "restore isolated"
    assert expected in added[0], added
    # Control: the same fact read as an ordinary event is the old phantom line.
    plain = [e for e in rt.ledger.events(session_id=SID) if e.run_id.startswith("resolution-")]
    old = transcript_lines([e.model_copy(update={"run_id": "r-plain"}) for e in plain])
    assert old and not old[0].startswith("-- operator"), old


def test_maka_ledger_gc_checkpoints_as_a_command(
    rt: Runtime, repo: Workspace, home: Path, tmp_path: Path
) -> None:
    import json

    parked_turn(rt, repo)
    orphan = provider_of(home).capture(repo, SID)  # a capture whose fact never committed
    assert hasattr(orphan, "ref")
    env = {**os.environ, "MAKA_HOME": str(home)}
    cmd = [
        sys.executable,
        "-m",
        "maka_temporal",
        "ledger",
        "gc-checkpoints",
        "--db",
        str(tmp_path / "ledger.sqlite"),
    ]
    young = subprocess.run([*cmd, "--json"], env=env, capture_output=True, text=True, cwd=ROOT)
    assert young.returncode == 0 and json.loads(young.stdout)["deleted"] == 0, young.stderr
    swept = subprocess.run([*cmd, "--grace", "0"], env=env, capture_output=True, text=True, cwd=ROOT)
    assert swept.returncode == 0, swept.stderr
    assert "1 orphan ref(s) deleted, 1 kept" in swept.stdout and orphan.ref in swept.stdout  # type: ignore[union-attr]
