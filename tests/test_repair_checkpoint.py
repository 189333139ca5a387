"""A run lost mid-turn and closed by repair gets the workspace checkpoint a run's own end gets.

A real child process runs a turn (a real write in a real Git workspace) and is SIGKILLed before its
terminal fact (P8): the run is lost. Repair (``settle_lost_runs``, as startup repair and ``maka
resume`` run it) closes it; an outside edit before the resume then parks ``workspace_content_changed``.
The control is the old repair (``bind=unbound``): the same edit continues on the changed folder.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from maka_core.checkpoints import Checkpoint, GitCheckpointProvider
from maka_core.errors import MakaError
from maka_core.runtime import turn, workspace_continuity
from maka_core.runtime.contracts import BeginRunInput, RunIds
from maka_core.runtime.lost_run import unbound
from maka_core.runtime.runtime import Runtime, RuntimeSettings
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from maka_temporal.workers.host.resume import settle_lost_runs
from tests.test_workspace_continuity import (
    IDS,
    ROOT,
    SCRIPT,
    SID,
    make_repo,
    parked_turn,
    provider_of,
    resume,
    terminal_bundle,
)

#: The repair's commit points (``test_git_checkpoints`` checks every checkpoint point is drilled).
REPAIR_POINTS = ("checkpoint_repair_captured", "checkpoint_repair_committed")

CHILD = r"""
import asyncio, sys
from pathlib import Path
sys.path.insert(0, {root!r})
from maka_core.runtime.runtime import Runtime, RuntimeSettings
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from maka_temporal.workers.host.resume import settle_lost_runs
from tests.test_workspace_continuity import parked_turn
rt = Runtime(LedgerStore.open({db!r}), settings=RuntimeSettings(maka_home=Path({home!r}), host={host!r}))
if {phase!r} == "turn":
    parked_turn(rt, Workspace.open({ws!r}, create=False), host="box-a")
else:
    asyncio.run(settle_lost_runs(rt, "s1"))
print("survived")
"""


def child(
    tmp_path: Path, home: Path, ws: Workspace, phase: str, point: str
) -> subprocess.CompletedProcess[str]:
    code = CHILD.format(
        root=str(ROOT), home=str(home), db=str(tmp_path / "ledger.sqlite"), ws=str(ws.root), phase=phase,
        host="box-a",
    )  # fmt: skip
    env = {**os.environ, "MAKA_FAILPOINT": point}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def lost(tmp_path: Path) -> tuple[Path, Workspace]:
    """A run whose worker was SIGKILLed after its write, before its terminal fact (P8)."""
    home = tmp_path / "home"
    home.mkdir()
    repo = make_repo(tmp_path / "proj")
    LedgerStore.open(tmp_path / "ledger.sqlite").close()
    proc = child(tmp_path, home, repo, "turn", "P8")
    assert proc.returncode == -9, proc.stderr[-2000:]
    return home, repo


def runtime(tmp_path: Path, home: Path, host: str | None = "box-a") -> Runtime:
    store = LedgerStore.open(tmp_path / "ledger.sqlite")
    return Runtime(store, settings=RuntimeSettings(maka_home=home, host=host))


def close(rt: Runtime) -> None:
    rt.close()
    rt.ledger.close()  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.parametrize("old_repair", [False, True])
def test_a_run_repair_closes_carries_a_checkpoint_and_a_later_edit_parks(
    tmp_path: Path, lost: tuple[Path, Workspace], old_repair: bool
) -> None:
    home, repo = lost
    rt = runtime(tmp_path, home)
    try:
        assert not any(e.is_terminal for e in rt.ledger.events(run_id=IDS.run_id))  # lost, not ended
        kw: dict[str, Any] = {"bind": unbound} if old_repair else {}
        assert asyncio.run(settle_lost_runs(rt, SID, **kw)) == [IDS.run_id]
        bundle = terminal_bundle(rt)
        (repo.root / "notes.txt").write_text("edited by a teammate after the crash\n")
        decision = resume(rt, home)
        if old_repair:  # the control: no checkpoint, the marker-only gate lets the edit through
            assert bundle is None and provider_of(home).refs(repo) == {}
            assert decision.decision == "continue", decision.to_json()
            checked = gate_checked(rt)  # and the claim says the boundary had no bundle at all
            assert checked is not None and "capturedBy" not in checked, checked
            assert (checked["code"], checked["noCheckpoint"]) == (
                "workspace_has_no_checkpoint",
                "checkpoint_bundle_absent",
            )
        else:
            assert bundle is not None and bundle.checkpoint is not None, bundle
            assert set(provider_of(home).refs(repo)) == {bundle.checkpoint.ref}
            assert decision.decision == "park", decision.to_json()
            assert decision.rejection_reasons == ("workspace_content_changed",)
            diag = next(d for d in decision.diagnostics if d["code"] == "workspace_content_changed")
            assert diag["detail"]["changedPaths"] == {"modified": ["notes.txt"]}
    finally:
        close(rt)


@pytest.mark.slow
@pytest.mark.parametrize("repairer", ["box-b", "box-a"])
def test_a_repair_off_the_workspaces_host_records_checkpoint_host_elsewhere(
    tmp_path: Path, lost: tuple[Path, Workspace], repairer: str
) -> None:
    home, repo = lost
    rt = runtime(tmp_path, home, host=repairer)
    try:
        asyncio.run(settle_lost_runs(rt, SID))
        bundle = terminal_bundle(rt)
        assert bundle is not None
        if repairer == "box-b":
            assert bundle.checkpoint is None and bundle.no_checkpoint is not None
            assert bundle.no_checkpoint.code == "checkpoint_host_elsewhere"
            assert provider_of(home).refs(repo) == {}
        else:  # the control: on the workspace's host the same repair captures
            assert bundle.checkpoint is not None
    finally:
        close(rt)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "orphans"),
    [
        # the artifact stored, the repair's fact not committed: the next repair captures again and
        # commits; the first ref is an orphan gc collects
        ("checkpoint_repair_captured", 1),
        # the fact with its bundle committed, the header lagging: the next repair follows the fact
        ("checkpoint_repair_committed", 0),
    ],
)
def test_sigkill_in_the_repair_leaves_an_orphan_or_a_whole_fact(
    tmp_path: Path, lost: tuple[Path, Workspace], point: str, orphans: int
) -> None:
    home, repo = lost
    proc = child(tmp_path, home, repo, "repair", point)
    assert proc.returncode == -9, proc.stderr[-2000:]
    rt = runtime(tmp_path, home)
    try:
        committed = any(e.is_terminal for e in rt.ledger.events(run_id=IDS.run_id))
        assert committed == (orphans == 0)
        asyncio.run(settle_lost_runs(rt, SID))
        header = rt.ledger.get_run(IDS.run_id)
        assert header is not None and header.is_terminal
        bundle = terminal_bundle(rt)
        assert bundle is not None and bundle.checkpoint is not None
        provider = provider_of(home)
        assert len(provider.refs(repo)) == 1 + orphans
        gc = workspace_continuity.gc_checkpoints(rt.ledger, provider, grace_seconds=0)  # type: ignore[arg-type]
        assert gc["deleted"] == orphans
        assert set(provider.refs(repo)) == {bundle.checkpoint.ref}
        (repo.root / "src.py").write_text("edited after the crash\n")
        assert resume(rt, home).rejection_reasons == ("workspace_content_changed",)
    finally:
        close(rt)


# --- the claim records which checkpoint the gate checked ------------------------------------------


def gate_checked(rt: Runtime) -> dict[str, Any] | None:
    (claim,) = rt.ledger.session_claims(SID)  # type: ignore[attr-defined]
    snapshot = (claim.target_run_header_json or {}).get("safetySnapshot") or {}
    return snapshot.get("workspaceGate")


@pytest.mark.parametrize("with_gate", [True, False])
def test_the_claim_records_the_checkpoint_that_allowed_the_continuation_and_the_audit_shows_it(
    tmp_path: Path, with_gate: bool
) -> None:
    from maka_core.audit.model import read_ledger
    from maka_core.audit.report import audit
    from maka_core.audit.text import report_lines

    home = tmp_path / "home"
    home.mkdir()
    repo = make_repo(tmp_path / "proj")
    rt = runtime(tmp_path, home, host=None)
    try:
        parked_turn(rt, repo)
        bundle = terminal_bundle(rt)
        assert bundle is not None and bundle.checkpoint is not None
        # The control is a planner without the gate: its claim records nothing, as every claim
        # before this one did, and the audit reads it all the same.
        decision = resume(rt, home) if with_gate else resume(rt, home, checkpoints=None)
        assert decision.decision == "continue", decision.to_json()
        checked = gate_checked(rt)
        report = audit(read_ledger(rt.ledger, SID, checkpoints=provider_of(home)), []).to_json()
        source = next(r["continuationSource"] for r in report["runs"] if r.get("continuationSource"))
        text = "\n".join(report_lines(report))
        if with_gate:
            expected = {
                "code": "workspace_matches_checkpoint",
                "sourceRunId": IDS.run_id,
                "workspaceEpoch": 0,
                "ref": bundle.checkpoint.ref,
                "tree": bundle.checkpoint.tree,
            }
            assert checked == expected
            assert source["workspaceGate"] == expected
            line = f"continuation gate: workspace_matches_checkpoint against {bundle.checkpoint.ref}"
            assert f"{line} tree {bundle.checkpoint.tree}" in text
        else:
            assert checked is None and "workspaceGate" not in source
            assert "continuation gate" not in text
    finally:
        close(rt)


def test_a_claim_over_a_boundary_without_a_checkpoint_records_why(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    plain = tmp_path / "plain"
    plain.mkdir()
    ws = Workspace.open(plain)  # no Git: the bundle records why, the gate passes as today
    rt = runtime(tmp_path, home, host=None)
    try:
        parked_turn(rt, ws)
        assert resume(rt, home).decision == "continue"
        checked = gate_checked(rt)
        assert checked is not None and "ref" not in checked
        assert (checked["code"], checked["noCheckpoint"]) == (
            "workspace_has_no_checkpoint",
            "workspace_not_git",
        )
    finally:
        close(rt)


# --- retention keyed by the ledger too ---------------------------------------------------------------


class SessionKeyedCarrier(GitCheckpointProvider):
    """The carrier as retention knew it before: a ref's session, never the ledger that captured it."""

    def ref_ledgers(self, workspace: Workspace) -> dict[str, str | None]:
        return dict.fromkeys(self.refs(workspace))


@pytest.mark.parametrize("knows_ledgers", [True, False])
def test_gc_keeps_the_refs_another_ledger_captured_for_the_same_session_id(
    tmp_path: Path, knows_ledgers: bool
) -> None:
    """Two ledgers on one MAKA_HOME each hold a session ``s1`` over the same workspace: each one's gc
    keeps the other's checkpoint and still collects its own orphan. Control: keyed by session only,
    ledger A's gc deletes ledger B's checkpoint and B's gate then fails closed."""
    home = tmp_path / "home"
    home.mkdir()
    repo = make_repo(tmp_path / "proj")
    a = Runtime(LedgerStore.open(tmp_path / "a.sqlite"), settings=RuntimeSettings(maka_home=home))
    b = Runtime(LedgerStore.open(tmp_path / "b.sqlite"), settings=RuntimeSettings(maka_home=home))
    try:
        parked_turn(a, repo)
        parked_turn(b, repo)
        ref_a, ref_b = (terminal_bundle(rt).checkpoint.ref for rt in (a, b))  # type: ignore[union-attr]
        assert ref_a != ref_b
        provider = provider_of(home)
        ledger_a = workspace_continuity.ledger_of(a.ledger)  # type: ignore[arg-type]
        assert ledger_a is not None
        orphan = provider.capture(repo, SID, ledger=ledger_a)  # A's artifact whose fact never committed
        assert isinstance(orphan, Checkpoint)
        carrier = provider if knows_ledgers else SessionKeyedCarrier(provider.state_dir)
        out = workspace_continuity.gc_checkpoints(a.ledger, carrier, grace_seconds=0)  # type: ignore[arg-type]
        if knows_ledgers:
            assert out["stores"][0]["deleted"] == [orphan.ref], out
            assert set(provider.refs(repo)) == {ref_a, ref_b}
            assert resume(b, home).decision == "continue"
        else:
            assert set(out["stores"][0]["deleted"]) == {orphan.ref, ref_b}, out
            assert resume(b, home).rejection_reasons == ("checkpoint_missing",)
    finally:
        for rt in (a, b):
            close(rt)


# --- gc deletes only what it listed, filtered under the lock ------------------------------------------


class ListingAgainCarrier(GitCheckpointProvider):
    """The carrier as retention knew it before: its gc lists the refs again under the lock and deletes
    whatever is not kept and past its grace, whatever the caller listed."""

    def gc(self, workspace: Workspace, keep: Any, **kw: Any) -> tuple[str, ...]:
        kw.pop("candidates", None)
        kw.pop("capturers", None)
        return super().gc(workspace, keep, **kw)


class CaptureDuringRead(LedgerStore):
    """A ledger whose whole read is slow enough that another ledger's capture lands during it."""

    during_read: Any = None

    def events(self, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs and self.during_read is not None:
            hook, self.during_read = self.during_read, None
            hook()
        return super().events(*args, **kwargs)


@pytest.mark.parametrize("listed_only", [True, False])
def test_gc_never_deletes_a_ref_captured_while_it_read_the_ledger(tmp_path: Path, listed_only: bool) -> None:
    """grace 0: ledger B captures a checkpoint of its own session while ledger A's gc reads A's facts.
    A's gc collects A's orphan and leaves B's new ref, and counts what is there. Control: the carrier
    that lists again under its lock deletes B's ref, judged against facts read before it existed."""
    home = tmp_path / "home"
    home.mkdir()
    repo = make_repo(tmp_path / "proj")
    a_store = CaptureDuringRead.open(tmp_path / "a.sqlite")
    assert isinstance(a_store, CaptureDuringRead)
    a = Runtime(a_store, settings=RuntimeSettings(maka_home=home))
    b_store = LedgerStore.open(tmp_path / "b.sqlite")
    try:
        parked_turn(a, repo)
        bundle = terminal_bundle(a)
        assert bundle is not None and bundle.checkpoint is not None
        provider = provider_of(home)
        orphan = provider.capture(repo, SID, ledger=workspace_continuity.ledger_of(a_store))
        assert isinstance(orphan, Checkpoint)
        captured: list[Checkpoint] = []

        def b_captures() -> None:
            out = provider.capture(repo, "b-session", ledger=workspace_continuity.ledger_of(b_store))
            assert isinstance(out, Checkpoint)
            captured.append(out)

        a_store.during_read = b_captures
        carrier = provider if listed_only else ListingAgainCarrier(provider.state_dir)
        out = workspace_continuity.gc_checkpoints(a_store, carrier, grace_seconds=0)
        (b_ref,) = (c.ref for c in captured)
        (row,) = out["stores"]
        if listed_only:
            assert row["deleted"] == [orphan.ref], out
            assert set(provider.refs(repo)) == {bundle.checkpoint.ref, b_ref}
            assert row["kept"] == out["kept"] == 2, out
        else:
            assert set(row["deleted"]) == {orphan.ref, b_ref}, out
            assert set(provider.refs(repo)) == {bundle.checkpoint.ref}
    finally:
        a.close()
        a_store.close()
        b_store.close()


class OwnershipOutsideTheLock(GitCheckpointProvider):
    """A carrier that applies no ledger filter itself (the caller's early ``ref_ledgers`` read was all)."""

    def gc(self, workspace: Workspace, keep: Any, **kw: Any) -> tuple[str, ...]:
        kw.pop("capturers", None)
        return super().gc(workspace, keep, **kw)


@pytest.mark.parametrize("filtered_under_lock", [True, False])
def test_the_carrier_keeps_another_ledgers_capture_among_the_candidates_it_is_given(
    tmp_path: Path, filtered_under_lock: bool
) -> None:
    """The ledger filter runs under the store's lock against each commit: a candidate another ledger
    captured is kept even when the caller named it. Control: without the filter it goes."""
    home = tmp_path / "home"
    home.mkdir()
    repo = make_repo(tmp_path / "proj")
    provider = provider_of(home)
    mine = provider.capture(repo, SID, ledger="ledger:a")
    theirs = provider.capture(repo, SID, ledger="ledger:b")
    assert isinstance(mine, Checkpoint) and isinstance(theirs, Checkpoint)
    candidates = {(r, oid) for r, (oid, _) in provider.refs(repo).items()}
    carrier = provider if filtered_under_lock else OwnershipOutsideTheLock(provider.state_dir)
    gone = carrier.gc(repo, (), grace_seconds=0, candidates=candidates, capturers={None, "ledger:a"})
    assert gone == ((mine.ref,) if filtered_under_lock else tuple(sorted((mine.ref, theirs.ref))))


def test_a_store_gc_cannot_list_is_skipped_and_the_others_are_collected(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    repo = make_repo(tmp_path / "proj")
    rt = runtime(tmp_path, home, host=None)
    try:
        parked_turn(rt, repo)
        provider = provider_of(home)
        orphan = provider.capture(repo, SID, ledger=workspace_continuity.ledger_of(rt.ledger))  # type: ignore[arg-type]
        assert isinstance(orphan, Checkpoint)
        broken = provider.state_dir / "git" / "0000broken.git"  # sorted first
        broken.mkdir()
        (broken / "HEAD").write_text("not a ref\n")
        handle = Workspace(root=broken, identity="workspace:v1:0000broken")
        with pytest.raises(MakaError):  # the control: listing this store really fails
            provider.refs(handle)
        out = workspace_continuity.gc_checkpoints(rt.ledger, provider, grace_seconds=0)  # type: ignore[arg-type]
        rows = {row["workspaceId"]: row for row in out["stores"]}
        assert rows["0000broken"]["skipped"] == "checkpoint_git_failed", out
        assert rows[repo.workspace_id]["deleted"] == [orphan.ref], out
        assert out["deleted"] == 1
        cmd = [sys.executable, "-m", "maka_temporal", "ledger", "gc-checkpoints", "--grace", "0"]
        cli = subprocess.run(
            [*cmd, "--db", str(tmp_path / "ledger.sqlite")],
            env={**os.environ, "MAKA_HOME": str(home)},
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert cli.returncode == 0, cli.stderr
        assert "skipped store 0000broken: checkpoint_git_failed" in cli.stdout, cli.stdout
    finally:
        close(rt)


# --- a repair capture says it is one -----------------------------------------------------------------


@pytest.mark.slow
def test_a_continuation_from_a_repair_capture_says_so_in_the_claim_and_the_audit(
    tmp_path: Path, lost: tuple[Path, Workspace]
) -> None:
    """An edit between the crash and the repair is inside the repair's checkpoint, so the gate's match
    vouches for the folder at the repair, not at the run's last boundary: the claim and the audit say
    the checkpoint was the repair's. (The control, a run's own end, records no ``capturedBy``:
    ``test_the_claim_records_the_checkpoint_that_allowed_the_continuation_and_the_audit_shows_it``.)"""
    from maka_core.audit.model import read_ledger
    from maka_core.audit.report import audit
    from maka_core.audit.text import report_lines

    home, repo = lost
    rt = runtime(tmp_path, home)
    try:
        (repo.root / "notes.txt").write_text("edited after the crash, before the repair\n")
        asyncio.run(settle_lost_runs(rt, SID))
        bundle = terminal_bundle(rt)
        assert bundle is not None and bundle.checkpoint is not None
        decision = resume(rt, home)
        assert decision.decision == "continue", decision.to_json()  # the edit is in the checkpoint
        checked = gate_checked(rt)
        assert checked is not None and checked["code"] == "workspace_matches_checkpoint", checked
        assert checked["capturedBy"] == "repair" and checked["ref"] == bundle.checkpoint.ref
        report = audit(read_ledger(rt.ledger, SID, checkpoints=provider_of(home)), []).to_json()
        source = next(r["continuationSource"] for r in report["runs"] if r.get("continuationSource"))
        assert source["workspaceGate"]["capturedBy"] == "repair"
        line = f"continuation gate: workspace_matches_checkpoint against {bundle.checkpoint.ref}"
        text = "\n".join(report_lines(report))
        assert f"{line} tree {bundle.checkpoint.tree} (captured by repair)" in text, text
    finally:
        close(rt)


# --- startup repair's captures share one budget -----------------------------------------------------


def begun_only(rt: Runtime, ws: Workspace, ids: RunIds) -> None:
    """A run whose worker died right after its user fact: lost, with nothing in flight."""
    begin = BeginRunInput(
        ids=ids, text="do it", ts=1, workflow_id=f"wf-{ids.session_id}", workflow_run_id="wr",
        task_queue="q", workspace=str(ws.root), workspace_identity=ws.identity, provider=SCRIPT,
    )  # fmt: skip
    asyncio.run(turn.begin_run(rt, begin))


@pytest.mark.parametrize("shared", [True, False])
def test_a_repair_pass_over_several_lost_sessions_shares_one_capture_budget(
    tmp_path: Path, shared: bool
) -> None:
    """Three lost sessions over a workspace no capture can finish in 1 ms: with one shared budget (as
    startup repair has) the first capture spends it and the other two capture nothing. Control: a
    budget per run (before) attempts all three, each using up its own."""
    home = tmp_path / "home"
    home.mkdir()
    repo = make_repo(tmp_path / "proj")
    for i in range(300):  # files no cache vouches for: the budget is checked between them
        (repo.root / f"gen{i}.txt").write_text(f"{i}\n")
    rt = runtime(tmp_path, home, host=None)
    sessions = [
        RunIds(session_id=f"s{n}", turn_id="t1", run_id=f"r{n}", invocation_id=f"i{n}") for n in range(3)
    ]
    try:
        for ids in sessions:
            begun_only(rt, repo, ids)
        budget = workspace_continuity.SharedBudget(0.001)
        for ids in sessions:
            one = budget if shared else workspace_continuity.SharedBudget(0.001)
            assert asyncio.run(settle_lost_runs(rt, ids.session_id, bind=one.bind)) == [ids.run_id]
        details = []
        for ids in sessions:
            bundle = terminal_bundle(rt, ids.run_id)
            assert bundle is not None and bundle.no_checkpoint is not None, bundle
            assert bundle.no_checkpoint.code == "checkpoint_budget_exceeded"
            details.append(bundle.no_checkpoint.detail == workspace_continuity.SHARED_BUDGET_SPENT)
        assert details == ([False, True, True] if shared else [False, False, False])
        assert provider_of(home).refs(repo) == {}
        # A session over a folder without Git, once the budget is spent: the record says no Git, as a
        # capture would have said first (it said checkpoint_budget_exceeded).
        (tmp_path / "plain").mkdir()
        plain = Workspace.open(tmp_path / "plain", create=True)
        ids = RunIds(session_id="s-plain", turn_id="t1", run_id="r-plain", invocation_id="i-plain")
        begun_only(rt, plain, ids)
        assert asyncio.run(settle_lost_runs(rt, ids.session_id, bind=budget.bind)) == [ids.run_id]
        plain_bundle = terminal_bundle(rt, ids.run_id)
        assert plain_bundle is not None and plain_bundle.no_checkpoint is not None, plain_bundle
        assert plain_bundle.no_checkpoint.code == "workspace_not_git", plain_bundle
        assert workspace_continuity.REPAIR_CAPTURE_BUDGET_S <= workspace_continuity.CAPTURE_BUDGET_S
    finally:
        close(rt)


@pytest.mark.parametrize("checked", [True, False])
def test_repair_of_a_chain_broken_session_over_git_captures_nothing(tmp_path: Path, checked: bool) -> None:
    """A row edited behind the writers: repair parks ``ledger_chain_broken`` and binds no checkpoint
    (nothing read from broken facts is acted on). Control: with the guard bypassed the same repair
    captures the workspace."""
    import sqlite3

    from maka_core.runtime.runtime import ResolverGuard
    from tests.children.unchecked_chain_worker import UncheckedChainGuard

    home = tmp_path / "home"
    home.mkdir()
    repo = make_repo(tmp_path / "proj")
    db = tmp_path / "ledger.sqlite"
    rt = runtime(tmp_path, home, host=None)
    try:
        begun_only(rt, repo, IDS)
    finally:
        close(rt)
    conn = sqlite3.connect(db)
    conn.execute("update runtime_events set payload_json = replace(payload_json, '\"do it\"', '\"rm -rf\"')")
    assert conn.total_changes == 1
    conn.commit()
    conn.close()
    guard = ResolverGuard() if checked else UncheckedChainGuard()
    rt = Runtime(LedgerStore.open(db), guard=guard, settings=RuntimeSettings(maka_home=home))
    try:
        assert asyncio.run(settle_lost_runs(rt, SID)) == [IDS.run_id]
        bundle = terminal_bundle(rt)
        terminal = next(e for e in rt.ledger.events(run_id=IDS.run_id) if e.is_terminal)
        delta = terminal.actions.state_delta if terminal.actions is not None else None
        if checked:
            assert delta is not None and delta.get("parkReason") == "ledger_chain_broken", delta
            assert bundle is None and provider_of(home).refs(repo) == {}
        else:
            assert bundle is not None and bundle.checkpoint is not None, bundle
            assert set(provider_of(home).refs(repo)) == {bundle.checkpoint.ref}
    finally:
        close(rt)


@pytest.mark.parametrize("named", [True, False], ids=["candidates-named", "control-no-candidates"])
def test_a_gc_left_nothing_to_delete_by_the_ledger_filter_does_not_repack(
    tmp_path: Path, named: bool
) -> None:
    """Another ledger's refs under this ledger's session id are never deleted, so a gc over them
    alone must not repack the store and drop the capture cache at every worker start (review M1).
    Control: a gc that names no candidates repacks (the cache goes), so the assertion can fail."""
    home = tmp_path / "home"
    home.mkdir()
    repo = make_repo(tmp_path / "proj")
    provider = provider_of(home)
    theirs = provider.capture(repo, SID, ledger="ledger:b")
    assert isinstance(theirs, Checkpoint)
    cache = provider._cache_path(repo)
    assert cache.exists(), cache
    candidates = {(r, oid) for r, (oid, _) in provider.refs(repo).items()} if named else None
    keep = () if named else (theirs.ref,)
    gone = provider.gc(repo, keep, grace_seconds=0, candidates=candidates, capturers={None, "ledger:a"})
    assert gone == ()
    assert cache.exists() is named, (named, cache)
