"""Recovery's guarded redo of a file write interrupted before its effect (``tools.redo``).

A ``write_file``/``edit_file`` with T1 and no T2 whose target still holds its recorded
before-state is redone once through ``guarded_replace``; every case of doubt parks. Proven three
ways, each with a negative control built by the test:

- in process, on every ledger backend: the redo, its bundle and receipt, the policy opt-out, and
  the parks (target in use, an unknown side file, a redo already recorded);
- SIGKILL drills in real processes: T1 committed by ``execute_tool`` killed at ``P3``, then a
  recovering process killed at each redo failpoint, then a clean one: never a second exchange.
  Control: a redo that ignores the recorded run writes a target an outside writer had set back;
- a writer process racing each recovery: zero lost outside writes. Control: the same recovery with
  a compare-then-rename replacement loses writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from maka_core import failpoints
from maka_core.errors import AttemptSuperseded
from maka_core.governance import parse_policy
from maka_core.runtime import cancellation, recovery, tool_admission, tool_effect
from maka_core.runtime.contracts import CallRef
from maka_core.runtime.runtime import Runtime
from maka_core.store.writer import LedgerStore
from maka_core.tools.base import FileEvidence, FileIdentity, Reconciliation
from maka_core.tools.beneath import locate, write_replace
from maka_core.tools.effect_journal import ENV as EFFECT_LOG_ENV
from maka_core.tools.files import WriteFileTool
from maka_core.tools.guarded_replace import GuardedReplace, guarded_replace, side_name
from maka_core.tools.redo import FIRST_REDO
from maka_core.tools.registry import default_tools
from maka_core.workspace import Workspace
from tests.test_governed_execution import with_policy
from tests.test_runtime import ATTEMPT, one_call, op_status, prepare_only, recover_input, run, tool_input

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "port=3000\n"
AFTER = "port=4000\n"
CALLS: dict[str, dict[str, Any]] = {
    "write_file": {"path": "conf/app.txt", "content": AFTER},
    "edit_file": {"path": "conf/app.txt", "old_text": "3000", "new_text": "4000"},
}


def leftovers(ws: Workspace) -> list[str]:
    return sorted(p.name for p in (ws.root / "conf").iterdir() if ".maka-" in p.name)


def interrupted(rt: Runtime, ws: Workspace, name: str) -> CallRef:
    """A call with T1 (and its evidence) committed and no effect: a crash before the write."""
    (ws.root / "conf").mkdir(exist_ok=True)
    (ws.root / "conf/app.txt").write_text(BEFORE)
    ref = one_call(rt, ws, name, CALLS[name])
    prepare_only(rt, ws, ref, CALLS[name])
    return ref


def redo_runs(rt: Runtime, ref: CallRef) -> int:
    """The operation's ``recovery`` attempt rows: one per redo recorded, one for its bundle."""
    return sum(a["phase"] == "recovery" for a in rt.ledger.attempts(ref.operation_id))  # type: ignore[attr-defined]


# --- in process ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_write_found_in_its_before_state_is_redone_once(rt: Runtime, ws: Workspace, name: str) -> None:
    ref = interrupted(rt, ws, name)
    result = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    assert (result.status, result.reason) == ("completed", "reconcile_matches_expected_state")
    assert not result.is_error
    assert (ws.root / "conf/app.txt").read_text() == AFTER and leftovers(ws) == []
    assert op_status(rt, ref) == ("completed", "recovery_bundle_completed")
    # The recovered outcome is what the write itself returns.
    outcome = next(e for e in rt.ledger.events(session_id="s1") if e.id == result.response_event_id)
    assert outcome.content is not None and outcome.content.kind == "function_response"
    assert outcome.content.result["value"]["sha256"] == FileIdentity.of(AFTER.encode()).sha256
    runs = redo_runs(rt, ref)  # the redo's own row, then the bundle's
    (ws.root / "conf/app.txt").write_text(BEFORE)  # an outside writer sets it back
    again = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    assert again.response_event_id == result.response_event_id and redo_runs(rt, ref) == runs
    assert (ws.root / "conf/app.txt").read_text() == BEFORE  # settled: never redone


def test_a_policy_that_opts_out_parks_as_before(rt: Runtime, ws: Workspace) -> None:
    with_policy(rt, {"redoInterruptedWrites": False})
    ref = interrupted(rt, ws, "write_file")
    result = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    assert (result.status, result.reason) == ("parked", "reconcile_matches_prior_state")
    assert (ws.root / "conf/app.txt").read_text() == BEFORE and redo_runs(rt, ref) == 1  # the bundle's
    # The flag is out of the digest when left at its default, so older policies keep theirs.
    assert "redoInterruptedWrites" in parse_policy({"redoInterruptedWrites": False}).to_json()
    assert "redoInterruptedWrites" not in parse_policy({"redoInterruptedWrites": True}).to_json()


def test_a_target_held_open_parks_and_keeps_what_the_holder_writes(rt: Runtime, ws: Workspace) -> None:
    ref = interrupted(rt, ws, "write_file")
    fd = os.open(ws.root / "conf/app.txt", os.O_WRONLY)  # a process that may still write into it
    try:
        result = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
        os.write(fd, b"port=5000\n")
    finally:
        os.close(fd)
    assert (result.status, result.reason) == ("parked", "reconcile_matches_prior_state")
    assert (ws.root / "conf/app.txt").read_text() == "port=5000\n" and leftovers(ws) == []
    assert redo_runs(rt, ref) == 2  # the redo was recorded (and refused), then the park


def test_an_unknown_side_file_parks_and_is_kept(rt: Runtime, ws: Workspace) -> None:
    ref = interrupted(rt, ws, "write_file")
    side = ws.root / "conf" / side_name("app.txt", FileIdentity.of(AFTER.encode()))
    side.write_text("nobody knows this\n")
    result = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    assert (result.status, result.reason) == ("parked", "reconcile_matches_prior_state")
    assert (ws.root / "conf/app.txt").read_text() == BEFORE and side.read_text() == "nobody knows this\n"


def test_a_redo_already_recorded_is_never_started_again(rt: Runtime, ws: Workspace) -> None:
    # A worker recorded its redo and died before the exchange (the drills do it for real).
    ref = interrupted(rt, ws, "edit_file")
    rt.ledger.record_rerun(ref.operation_id)
    result = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    assert (result.status, result.reason) == ("parked", "reconcile_matches_prior_state")
    assert (ws.root / "conf/app.txt").read_text() == BEFORE


def test_a_target_changed_before_recovery_is_not_redone(rt: Runtime, ws: Workspace) -> None:
    ref = interrupted(rt, ws, "write_file")
    (ws.root / "conf/app.txt").write_text("port=5000\n")
    result = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    assert (result.status, result.reason) == ("parked", "reconcile_diverged")
    assert (ws.root / "conf/app.txt").read_text() == "port=5000\n" and redo_runs(rt, ref) == 1


class UnguardedOriginal(WriteFileTool):
    """Negative control: the original write as it was, an unconditional rename (no T1 guard)."""

    def with_evidence(self, evidence: FileEvidence) -> UnguardedOriginal:
        return self


@pytest.mark.parametrize("tool", [WriteFileTool, UnguardedOriginal], ids=["guarded", "control-unguarded"])
def test_a_late_original_after_its_redo_never_overwrites_a_later_write(
    store: LedgerStore, ws: Workspace, tool: type[WriteFileTool]
) -> None:
    rt = Runtime(store, tools={**default_tools(), "write_file": tool()})
    (ws.root / "conf").mkdir()
    target = ws.root / "conf/app.txt"
    target.write_text(BEFORE)
    ref = one_call(rt, ws, "write_file", CALLS["write_file"])
    # T1 as the original attempt commits it; then it stalls (frozen past its heartbeat timeout).
    original = tool_admission.admit_call(rt, tool_input(ws, ref), ATTEMPT)
    assert isinstance(original, tool_admission.Dispatched)
    redone = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    assert redone.status == "completed" and target.read_text() == AFTER
    target.write_text("port=5000\n")  # the session's next write
    if tool is UnguardedOriginal:
        late = tool_effect.run_effect(original, ref, cancellation.Cancellation())  # the original wakes up
        assert isinstance(late, tool_effect.Ran)
        assert target.read_text() == AFTER  # the later write is lost under the late original's
        return
    # The original wakes up: recovery took its call over (the fence), so it writes nothing and
    # has no result to commit (the model saw the redone outcome only).
    with pytest.raises(AttemptSuperseded):
        tool_effect.run_effect(original, ref, cancellation.Cancellation())
    assert target.read_text() == "port=5000\n" and leftovers(ws) == []
    assert op_status(rt, ref) == ("completed", "recovery_bundle_completed")


class FlatRedo(WriteFileTool):
    """Negative control: the redo as it was, making no missing folder."""

    @staticmethod
    def replace(
        root: str, rel: str, before: FileIdentity | None, data: bytes, max_bytes: int
    ) -> GuardedReplace:
        return guarded_replace(root, rel, before, data, max_bytes=max_bytes)


@pytest.mark.parametrize("tool", [WriteFileTool, FlatRedo], ids=["parents-made", "control-flat"])
def test_a_write_into_a_new_folder_is_redone_with_its_folders(
    store: LedgerStore, ws: Workspace, tool: type[WriteFileTool]
) -> None:
    rt = Runtime(store, tools={**default_tools(), "write_file": tool()})
    args = {"path": "new/deeper/a.txt", "content": AFTER}
    ref = one_call(rt, ws, "write_file", args)
    prepare_only(rt, ws, ref, args)  # T1 (before: absent), then a crash before the write
    result = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    if tool is FlatRedo:
        assert (result.status, result.reason) == ("parked", "reconcile_matches_prior_state")
        return
    assert (result.status, result.reason) == ("completed", "reconcile_matches_expected_state")
    assert (ws.root / "new/deeper/a.txt").read_text() == AFTER


class RefusingWrite(WriteFileTool):
    """A filesystem without ``RENAME_EXCHANGE`` (none here lacks it): the replacement refuses."""

    @staticmethod
    def replace(
        root: str, rel: str, before: FileIdentity | None, data: bytes, max_bytes: int
    ) -> GuardedReplace:
        return GuardedReplace(code="exchange_unsupported", detail="EINVAL")


def test_an_unsupported_exchange_parks_with_nothing_changed(store: LedgerStore, ws: Workspace) -> None:
    rt = Runtime(store, tools={**default_tools(), "write_file": RefusingWrite()})
    ref = interrupted(rt, ws, "write_file")
    result = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    assert (result.status, result.reason) == ("parked", "reconcile_matches_prior_state")
    assert (ws.root / "conf/app.txt").read_text() == BEFORE and leftovers(ws) == []


class Counted(WriteFileTool):
    """Counts the replacements started and the settles that touched the disk (each may exchange)."""

    calls: ClassVar[list[str]] = []
    settles: ClassVar[list[str]] = []

    @staticmethod
    def replace(
        root: str, rel: str, before: FileIdentity | None, data: bytes, max_bytes: int
    ) -> GuardedReplace:
        Counted.calls.append(rel)
        return WriteFileTool.replace(root, rel, before, data, max_bytes)

    @staticmethod
    def settle(
        root: str,
        rel: str,
        before: FileIdentity | None,
        after: FileIdentity,
        observe: Callable[[], dict[str, Any]],
        max_bytes: int,
        peer_live: bool,
    ) -> tuple[GuardedReplace | None, dict[str, Any] | None]:
        done = WriteFileTool.settle(root, rel, before, after, observe, max_bytes, peer_live)
        if done[0] is not None and done[0].code != "redo_already_started":
            Counted.settles.append(done[0].outcome or done[0].code or "")  # it repaired or swapped
        return done


#: The recoveries racing in ``test_recoveries_racing_each_other_exchange_at_most_once``.
WORKERS = 4


class EveryRunFirst(Counted):
    """Negative control: every recovery believes it recorded the first redo (run 2)."""

    #: All the racing recoveries meet here before any replacement runs: none can settle the
    #: operation (and so spare a slower peer its replacement) before every peer has started one.
    together: ClassVar[threading.Barrier] = threading.Barrier(WORKERS, timeout=60)

    @staticmethod
    def replace(
        root: str, rel: str, before: FileIdentity | None, data: bytes, max_bytes: int
    ) -> GuardedReplace:
        # A peer that never comes breaks the barrier: the count the test asserts says how many did.
        with contextlib.suppress(threading.BrokenBarrierError):
            EveryRunFirst.together.wait()
        return Counted.replace(root, rel, before, data, max_bytes)

    def redo(
        self,
        args: dict[str, Any],
        ws: Workspace,
        evidence: FileEvidence,
        prior: Reconciliation,
        run: int | None,
    ) -> Reconciliation:
        return super().redo(args, ws, evidence, prior, FIRST_REDO)


@pytest.mark.parametrize("tool", [Counted, EveryRunFirst], ids=["recorded-run", "control-every-run-2"])
def test_recoveries_racing_each_other_exchange_at_most_once(
    store_url: str, ws: Workspace, tool: type[Counted]
) -> None:
    # Four workers recover the same operation at once (a timed-out attempt still running beside its
    # retry), on every ledger backend: no recovery raises, all report the one settled outcome, and
    # the exchanges are run 2's alone: no other recovery starts a replacement or touches the disk
    # while settling. (That a redo never runs twice across crashes is the set-back drill below.)
    first = LedgerStore.open(store_url)
    ref = interrupted(Runtime(first), ws, "write_file")
    Counted.calls.clear()
    Counted.settles.clear()
    EveryRunFirst.together.reset()
    # One in-memory database is one store, shared; every other backend gets a store per worker.
    stores = [first if store_url == "sqlite://" else LedgerStore.open(store_url) for _ in range(WORKERS)]
    workers = [Runtime(s, tools={**default_tools(), "write_file": tool()}) for s in stores]
    barrier = threading.Barrier(len(workers))
    results: list[Any] = []

    def recover(rt: Runtime) -> None:
        barrier.wait()
        results.append(run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT)))

    threads = [threading.Thread(target=recover, args=(rt,)) for rt in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for s in {id(s): s for s in (first, *stores)}.values():
        s.close()
    assert len(results) == len(workers), "a recovery raised or hung"
    assert len({(r.status, r.response_event_id) for r in results}) == 1, results
    content = (ws.root / "conf/app.txt").read_text()
    assert leftovers(ws) == [] and Counted.settles == [], Counted.settles
    # Never applied while the target holds the old bytes; a park is a doubt (a peer parked while
    # run 2 was still exchanging), whatever the target holds.
    assert content == AFTER if results[0].status == "completed" else content in (BEFORE, AFTER)
    if tool is EveryRunFirst:
        # The control starts a replacement in every recovery (its barrier lets none finish first),
        # so it fails the real case's ``len(Counted.calls) <= 1`` by construction.
        assert len(Counted.calls) == len(workers), (Counted.calls, EveryRunFirst.together.broken)
        return
    assert len(Counted.calls) <= 1 and (content == AFTER) <= (len(Counted.calls) == 1), Counted.calls


# --- SIGKILL drills ------------------------------------------------------------------------------


def thread_states(pid: int) -> dict[str, str]:
    """Each thread's scheduler state (``R``, ``S``, ``T``...) from ``/proc/<pid>/task/*/stat``."""
    states = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            states[task.name] = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
            continue
    return states


class Drill:
    """One ledger and workspace; each step is a real process (``tests.children.redo_child``)."""

    def __init__(self, tmp: Path, name: str) -> None:
        self.db, self.name, self.log = tmp / "ledger.sqlite", name, tmp / "effects.log"
        root = tmp / "ws"
        (root / "conf").mkdir(parents=True)
        (root / "conf/app.txt").write_text(BEFORE)
        self.ws = Workspace.open(root)
        self.target = root / "conf/app.txt"
        out = self.child("call", point="P3", tag=name)
        assert out.returncode == -9 and len(out.stdout.splitlines()) == 1, out.stderr  # T1, no T2
        self.ref = out.stdout.splitlines()[0]

    def child(
        self, phase: str, *extra: str, point: str | None = None, tag: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        argv, env = self.argv(phase, *extra, point=point, tag=tag)
        return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)

    def argv(
        self, phase: str, *extra: str, point: str | None = None, tag: str | None = None
    ) -> tuple[list[str], dict[str, str]]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAKA_FAILPOINT")}
        env |= {"PYTHONPATH": str(ROOT), EFFECT_LOG_ENV: str(self.log)}
        if point is not None:
            env["MAKA_FAILPOINT"] = point
        if tag is not None:
            env["MAKA_FAILPOINT_TAG"] = tag
        argv = [sys.executable, "-m", "tests.children.redo_child", str(self.db), str(self.ws.root), phase]
        return [*argv, self.name, *extra], env

    def frozen(self, point: str) -> subprocess.Popen[str]:
        """A recovery that stops itself (SIGSTOP) at ``point``, alive and frozen, until SIGCONT."""
        argv, env = self.argv("recover", self.ref, point=point)
        proc = subprocess.Popen(
            argv, cwd=ROOT, env={**env, "MAKA_FAILPOINT_ACTION": "stop"}, stdout=subprocess.PIPE, text=True
        )
        # Every thread, not the main one's state alone: the point fires on a tool-pool thread, and
        # the process is frozen at it only once that thread (and so all of them) is stopped.
        deadline, states = time.monotonic() + 60, {"main": ""}
        while time.monotonic() < deadline and set(states.values()) != {"T"} and proc.poll() is None:
            states = thread_states(proc.pid)
            time.sleep(0.02)
        assert set(states.values()) == {"T"}, (
            f"the recovery never stopped at {point} (thread states {states}, rc {proc.poll()})"
        )
        return proc

    def recover(self, point: str | None = None, naive: bool = False, *flags: str) -> dict[str, Any]:
        # The redo's own points carry the tool's name; guarded_replace's carry none.
        tag = self.name if point in failpoints.REDO else None
        out = self.child("recover", self.ref, *(["--naive"] if naive else []), *flags, point=point, tag=tag)
        if point is not None:
            assert out.returncode == -9, f"not killed at {point}: {out.stdout} {out.stderr}"
            return {}
        assert out.returncode == 0, out.stderr
        return dict(json.loads(out.stdout.splitlines()[-1]))

    def effects(self) -> int:
        return len(self.log.read_text().splitlines()) if self.log.exists() else 0

    def receipt(self) -> dict[str, Any]:
        store = LedgerStore.open(f"sqlite:///{self.db}")
        try:
            (receipt,) = [r for r in store.receipts("s1") if r["kind"] == "action_receipt"]
        finally:
            store.close()
        return dict(receipt)


#: Where a kill inside the redo leaves the target, and how the next worker settles it. Nothing is
#: exchanged a second time: the next run (3) only settles a leftover and observes.
KILLS = {
    # recorded, nothing written: the pre-exchange state; a redo was started, so it parks
    "redo_recorded": ("parked", BEFORE),
    # the side file written, not exchanged: removed (only our content), then it parks
    "guarded_replace_before_exchange": ("parked", BEFORE),
    # exchanged, not checked: the swapped-out file is the before-state, so the exchange is kept
    "guarded_replace_after_exchange": ("completed", AFTER),
    # done, its bundle not committed: the target holds the new content, settled from evidence
    "redo_settled": ("completed", AFTER),
}


def test_every_redo_failpoint_is_drilled() -> None:
    assert set(failpoints.REDO) <= set(KILLS) and set(KILLS) - set(failpoints.REDO) <= set(
        failpoints.CHECKPOINT
    )


@pytest.mark.crash
@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_killed_tool_is_redone_once_by_a_clean_recovery(tmp_path: Path, name: str) -> None:
    drill = Drill(tmp_path, name)
    assert drill.target.read_text() == BEFORE and drill.effects() == 0  # killed before its effect
    result = drill.recover()
    assert (result["status"], result["reason"]) == ("completed", "reconcile_matches_expected_state")
    assert drill.target.read_text() == AFTER and drill.effects() == 1 and leftovers(drill.ws) == []
    effect = drill.receipt()["observedEffect"]
    assert effect["status"] == "verified_success" and effect["attempts"] == [1, 2]
    assert (effect["redo"]["run"], effect["redo"]["outcome"]) == (2, "replaced")


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("point", sorted(KILLS))
def test_a_recovery_killed_inside_the_redo_is_settled_without_a_second_exchange(
    tmp_path: Path, name: str, point: str
) -> None:
    drill = Drill(tmp_path, name)
    drill.recover(point=point)
    status, content = KILLS[point]
    result = drill.recover()
    assert result["status"] == status, result
    assert result["reason"] == (
        "reconcile_matches_expected_state" if status == "completed" else "reconcile_matches_prior_state"
    )
    assert drill.target.read_text() == content and leftovers(drill.ws) == []
    assert drill.effects() == int(point == "redo_settled")  # the log line follows a finished redo
    effect = drill.receipt()["observedEffect"]
    # One run recorded besides T1's; the next recovery only settled (no run of its own).
    assert effect["attempts"] == [1, 2] and effect["redo"]["code"] == "redo_already_started"
    assert "run" not in effect["redo"]
    assert effect["redo"].get("outcome") == (
        "repaired" if point == "guarded_replace_after_exchange" else None
    )
    again = drill.recover()  # settled for good
    assert (again["status"], again.get("response_event_id")) == (status, result.get("response_event_id"))


@pytest.mark.crash
@pytest.mark.parametrize("naive", [False, True], ids=["recorded-run", "control-run-ignored"])
def test_a_target_set_back_after_a_killed_redo_is_never_written_again(tmp_path: Path, naive: bool) -> None:
    drill = Drill(tmp_path, "write_file")
    drill.recover(point="redo_settled")  # the redo landed; the worker died before its bundle
    drill.target.write_text(BEFORE)  # an outside writer sets the file back to the before bytes
    result = drill.recover(naive=naive)
    seen = (result["status"], drill.target.read_text(), drill.effects())
    if naive:
        # The control cannot tell a redo from none: it redoes, over the outside write.
        assert seen == ("completed", AFTER, 2)
        return
    assert seen == ("parked", BEFORE, 1)


@pytest.mark.crash
@pytest.mark.parametrize("control", [False, True], ids=["folder-lock", "control-unlocked-settle"])
def test_a_recovery_beside_a_frozen_redo_touches_nothing(tmp_path: Path, control: bool) -> None:
    # A recovery redoes (run 2) and freezes right after its exchange, alive (a timed-out attempt);
    # its retry (which sees the redo recorded) runs beside it and must not settle a half-done one.
    drill = Drill(tmp_path, "write_file")
    first = drill.frozen("guarded_replace_after_exchange")
    side = drill.target.parent / side_name("app.txt", FileIdentity.of(AFTER.encode()))
    try:
        # Exchanged, unchecked: the target holds the new bytes, the side file the old ones.
        seen_frozen = (drill.target.read_text(), side.read_text() if side.exists() else None)
        assert seen_frozen == (AFTER, BEFORE), (seen_frozen, leftovers(drill.ws), thread_states(first.pid))
        beside = drill.recover(None, False, *(["--unlocked"] if control else []))
        seen = (side.exists(), drill.target.read_text())
    finally:
        first.send_signal(signal.SIGCONT)
        out, _ = first.communicate(timeout=120)
    if control:
        assert seen[0] is False, seen  # the old settle finished (and removed) the live redo's exchange
        return
    assert seen == (True, AFTER), seen  # nothing touched while the first one held its folder
    assert (beside["status"], beside["reason"]) == ("parked", "reconcile_unreadable")
    assert drill.receipt()["observedEffect"]["redo"]["code"] == "redo_already_started"
    assert first.returncode == 0, out
    assert drill.target.read_text() == AFTER and leftovers(drill.ws) == []  # the first one finished


# --- a writer racing the recovery ----------------------------------------------------------------

# As in tests/test_guarded_replace.py: one write per round after a delay the parent picks, by
# rename or in place through a descriptor opened before the delay.
WRITER = r"""
import os, sys, time
path = sys.argv[1]
for line in sys.stdin:
    delay, mode, text = line.split(" ", 2)
    data = text.encode()
    if mode == "inplace":
        fd = os.open(path, os.O_WRONLY)
        print("ready", flush=True)
        time.sleep(float(delay))
        os.write(fd, data)
        os.close(fd)
    else:
        print("ready", flush=True)
        time.sleep(float(delay))
        tmp = path + ".w"
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.rename(tmp, path)
    print("done", flush=True)
"""


class BlindRedoWrite(WriteFileTool):
    """Negative control: the redo's replacement is compare-then-rename (no CAS at the swap)."""

    @staticmethod
    def replace(
        root: str, rel: str, before: FileIdentity | None, data: bytes, max_bytes: int
    ) -> GuardedReplace:
        with locate(root, rel, for_write=True) as target:
            assert target.dir_fd is not None
            fd = os.open(target.name, os.O_RDONLY, dir_fd=target.dir_fd)
            try:
                current = FileIdentity.of(os.read(fd, 1 << 20))
            finally:
                os.close(fd)
            if current != before:
                return GuardedReplace(code="target_diverged")
            write_replace(target.dir_fd, target.name, data)
        return GuardedReplace(outcome="replaced")


class Timed(WriteFileTool):
    """Records when the replacement starts, to aim the writer's delays at it."""

    started: list[float] = []

    @staticmethod
    def replace(
        root: str, rel: str, before: FileIdentity | None, data: bytes, max_bytes: int
    ) -> GuardedReplace:
        Timed.started.append(time.monotonic())
        return WriteFileTool.replace(root, rel, before, data, max_bytes)


def one_round(tmp: Path, i: int, tool: WriteFileTool, ws: Workspace) -> tuple[Runtime, CallRef]:
    rt = Runtime(LedgerStore.open("sqlite://"), tools={**default_tools(), "write_file": tool})
    (ws.root / "conf").mkdir(exist_ok=True)
    (ws.root / "conf/app.txt").write_text(BEFORE)
    ref = one_call(rt, ws, "write_file", {"path": "conf/app.txt", "content": AFTER})
    prepare_only(rt, ws, ref, {"path": "conf/app.txt", "content": AFTER})
    return rt, ref


def aim(tmp: Path, ws: Workspace) -> float:
    """How long after a recovery starts its replacement begins (median of a few, no writer)."""
    offsets = []
    for i in range(7):
        rt, ref = one_round(tmp, i, Timed(), ws)
        start = time.monotonic()
        run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
        offsets.append(Timed.started[-1] - start)
        rt.close()
    return sorted(offsets)[3]


def race(tmp: Path, ws: Workspace, tool: WriteFileTool, rounds: int, offset: float) -> dict[str, int]:
    counts = {"lost": 0, "redone": 0, "parked": 0}
    target = ws.root / "conf/app.txt"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(target)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert writer.stdin is not None and writer.stdout is not None
    try:
        for i in range(rounds):
            rt, ref = one_round(tmp, i, tool, ws)
            outside = f"port={i:05d}\n"
            # Delays from before the observation to past the exchange, denser around the exchange.
            delay = offset * (0.6 + 0.05 * (i % 17))
            writer.stdin.write(f"{delay:.6f} {'inplace' if i % 2 else 'rename'} {outside}")
            writer.stdin.flush()
            assert writer.stdout.readline() == "ready\n"
            result = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
            assert writer.stdout.readline() == "done\n"
            rt.close()
            counts["redone" if result.status == "completed" else "parked"] += 1
            counts["lost"] += target.read_text() != outside
    finally:
        writer.kill()
        writer.wait()
    return counts


@pytest.mark.slow
def test_a_writer_racing_the_redo_never_loses_a_write(tmp_path: Path, ws: Workspace) -> None:
    offset = aim(tmp_path, ws)
    control = {"lost": 0}
    start = time.monotonic()
    while not control["lost"] and time.monotonic() - start < 90:  # the machine may be busy
        control = race(tmp_path, ws, BlindRedoWrite(), 150, offset)
    assert control["lost"] > 0, f"the blind redo never lost a write: the race proves nothing ({control})"
    guarded = race(tmp_path, ws, WriteFileTool(), 400, offset)
    print("offset", round(offset * 1000, 2), "ms; control", control, "guarded", guarded)
    assert guarded["lost"] == 0, guarded
    assert guarded["redone"] > 0 and guarded["parked"] > 0  # both sides of the race were reached
    assert leftovers(ws) == []
