"""Recovery obeys every guarantee a user tool declares, without Temporal: T1 committed (with its
decision) and no T2, as a crash before the outcome leaves it, then the RecoveryResolver's path.

read-only runs again; provider-idempotent and at-least-once run again with the key recorded with
T1, the receipt listing the runs; reconciliation-required settles from the tool's own committed
evidence or parks; at-most-once parks ``dispatch_without_response``. Negative control: the same
at-most-once effect declared ``at-least-once`` (``user_tools_pkg.wide``) runs a second time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from maka_core.runtime import recovery, tool_admission
from maka_core.runtime.runtime import Runtime
from maka_core.store.writer import LedgerStore
from maka_core.tools import FunctionTool, idempotency_key
from maka_core.tools.registry import default_tools
from maka_core.workspace import Workspace
from tests.test_runtime import ATTEMPT, one_call, recover_input, run, tool_input
from tests.user_tools_pkg import effects, wide

HONEST = [effects.lookup, effects.charge, effects.notify, effects.append_entry, effects.put_note]
WIDE = [wide.lookup, wide.charge, wide.notify, wide.append_entry, wide.put_note]


def runtime(tmp_path: Path, tools: list[FunctionTool]) -> Runtime:
    store = LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    return Runtime(store, tools={**default_tools(), **{t.name: t for t in tools}})


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    (tmp_path / "ws").mkdir()
    return Workspace.open(tmp_path / "ws")


@pytest.fixture
def honest(tmp_path: Path) -> Iterator[Runtime]:
    rt = runtime(tmp_path, HONEST)
    yield rt
    rt.close()


def crashed_after_effect(rt: Runtime, ws: Workspace, name: str, args: dict[str, Any]) -> Any:
    """T1 as the tool path commits it, the effect run once, and no T2: a kill at P4."""
    ref = one_call(rt, ws, name, args)
    admitted = tool_admission.admit_call(rt, tool_input(ws, ref), ATTEMPT)
    assert isinstance(admitted, tool_admission.Dispatched), admitted
    admitted.tool.run(admitted.args, admitted.ws, lambda: None)  # the effect; its outcome is lost
    return ref


def lines(ws: Workspace, name: str) -> list[str]:
    path = ws.root / name
    return path.read_text().splitlines() if path.exists() else []


def test_read_only_runs_again(honest: Runtime, ws: Workspace) -> None:
    ref = crashed_after_effect(honest, ws, "lookup", {"name": "ada"})
    result = run(recovery.recover_operation(honest, recover_input(ws, ref), ATTEMPT))
    assert (result.status, result.reason) == ("completed", "replay_safe_reread")
    assert len(lines(ws, "lookups.log")) == 2


def test_provider_idempotent_runs_again_with_the_key_recorded_with_t1(honest: Runtime, ws: Workspace) -> None:
    ref = crashed_after_effect(honest, ws, "charge", {"amount": 5})
    held = honest.ledger.decision(ref.operation_id)
    assert held is not None
    key = held["decision"]["idempotencyKey"]
    assert key == idempotency_key("s1", ref.operation_id)
    assert held["decision"]["executionGuarantee"] == "provider-idempotent"
    result = run(recovery.recover_operation(honest, recover_input(ws, ref), ATTEMPT))
    assert (result.status, result.reason) == ("completed", "idempotent_rerun")
    assert lines(ws, "provider/requests.log") == [key, key]  # both runs presented the same key
    assert lines(ws, "provider/charges.log") == [key]  # so the provider charged once
    (receipt,) = [r for r in honest.ledger.receipts("s1") if r.get("taskId") == ref.operation_id]  # type: ignore[attr-defined]
    assert receipt["observedEffect"]["attempts"] == [1, 2]
    assert receipt["executionGuarantee"] == "provider-idempotent"


def test_a_second_crash_numbers_the_next_run_on(honest: Runtime, ws: Workspace) -> None:
    ref = crashed_after_effect(honest, ws, "notify", {"text": "hi"})
    # A rerun that was recorded and then crashed before its effect began.
    assert honest.ledger.record_rerun(ref.operation_id) == 2
    result = run(recovery.recover_operation(honest, recover_input(ws, ref), ATTEMPT))
    assert result.status == "completed"
    (receipt,) = [r for r in honest.ledger.receipts("s1") if r.get("taskId") == ref.operation_id]  # type: ignore[attr-defined]
    assert receipt["observedEffect"]["attempts"] == [1, 2, 3]
    assert len(lines(ws, "outbox.log")) == 2  # the first run and the third sent


def test_at_most_once_parks_with_exactly_one_effect(honest: Runtime, ws: Workspace) -> None:
    ref = crashed_after_effect(honest, ws, "append_entry", {"text": "pay"})
    result = run(recovery.recover_operation(honest, recover_input(ws, ref), ATTEMPT))
    assert (result.status, result.reason) == ("parked", "dispatch_without_response")
    assert lines(ws, "journal.log") == ["pay"]


def test_negative_control_a_wide_declaration_runs_the_effect_twice(tmp_path: Path, ws: Workspace) -> None:
    rt = runtime(tmp_path, WIDE)
    try:
        ref = crashed_after_effect(rt, ws, "append_entry", {"text": "pay"})
        result = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
        assert result.status == "completed"
        assert lines(ws, "journal.log") == ["pay", "pay"]  # what at-most-once prevents
    finally:
        rt.close()


def test_reconciliation_settles_from_the_tools_own_evidence(honest: Runtime, ws: Workspace) -> None:
    ref = crashed_after_effect(honest, ws, "put_note", {"name": "n1", "text": "hello"})
    evidence = honest.ledger.evidence(ref.operation_id)
    assert evidence is not None and evidence["schema"] == "tests.note/v1"
    result = run(recovery.recover_operation(honest, recover_input(ws, ref), ATTEMPT))
    assert (result.status, result.reason) == ("completed", "reconcile_matches_expected_state")


@pytest.mark.parametrize(
    ("tamper", "park"),
    [("gone", "reconcile_matches_prior_state"), ("other", "reconcile_diverged")],
)
def test_reconciliation_parks_when_the_evidence_does_not_hold(
    honest: Runtime, ws: Workspace, tamper: str, park: str
) -> None:
    ref = crashed_after_effect(honest, ws, "put_note", {"name": "n1", "text": "hello"})
    note = ws.root / "notes" / "n1"
    if tamper == "gone":
        note.unlink()
    else:
        note.write_text("someone else's")
    result = run(recovery.recover_operation(honest, recover_input(ws, ref), ATTEMPT))
    assert (result.status, result.reason) == ("parked", park)
    assert not note.exists() or note.read_text() == "someone else's"  # finalize-only: never rewritten


def test_a_reconcile_hook_that_raises_parks_unreadable(tmp_path: Path, ws: Workspace) -> None:
    def broken(args: Any, evidence: Any, ctx: Any) -> Any:
        raise OSError("disk gone")

    raising = FunctionTool(
        name="put_note",
        run=effects.put_note.run_fn,
        args_model=effects.Note,
        guarantee="reconciliation-required",
        evidence=effects.note_evidence,
        reconcile=broken,
    )
    rt = runtime(tmp_path, [raising])
    try:
        ref = crashed_after_effect(rt, ws, "put_note", {"name": "n1", "text": "hello"})
        result = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
        assert (result.status, result.reason) == ("parked", "reconcile_unreadable")
    finally:
        rt.close()


# --- a policy narrows a declared guarantee, never widens it ---------------------------------------


def with_policy(rt: Runtime, policy: dict[str, Any]) -> None:
    from maka_core.governance import parse_policy
    from maka_core.runtime.governed import SessionGovernance

    record = SessionGovernance(parse_policy(policy)).to_record()
    rt.ledger.put_session_policy(  # type: ignore[attr-defined]
        "s1",
        policy=record["policy"],
        version=record["version"],
        digest=record["digest"],
        identity=record["identity"],
    )


def test_a_policy_narrows_a_keyed_tool_to_at_most_once(honest: Runtime, ws: Workspace) -> None:
    with_policy(honest, {"mutations": "allow", "toolGuarantees": {"charge": "at-most-once"}})
    ref = crashed_after_effect(honest, ws, "charge", {"amount": 5})
    held = honest.ledger.decision(ref.operation_id)
    assert held is not None and held["decision"]["executionGuarantee"] == "at-most-once"
    assert "idempotencyKey" not in held["decision"]
    result = run(recovery.recover_operation(honest, recover_input(ws, ref), ATTEMPT))
    assert (result.status, result.reason) == ("parked", "dispatch_without_response")
    assert len(lines(ws, "provider/requests.log")) == 1  # never re-run


def test_a_policy_cannot_widen_an_at_most_once_tool(honest: Runtime, ws: Workspace) -> None:
    with_policy(honest, {"mutations": "allow", "toolGuarantees": {"append_entry": "read-only"}})
    ref = crashed_after_effect(honest, ws, "append_entry", {"text": "pay"})
    held = honest.ledger.decision(ref.operation_id)
    assert held is not None and held["decision"]["executionGuarantee"] == "at-most-once"
    result = run(recovery.recover_operation(honest, recover_input(ws, ref), ATTEMPT))
    assert result.status == "parked" and lines(ws, "journal.log") == ["pay"]


def test_an_empty_tool_guarantees_leaves_the_policy_digest_alone() -> None:
    from maka_core.governance import parse_policy

    assert (
        parse_policy({"mutations": "allow"}).digest
        == parse_policy({"mutations": "allow", "toolGuarantees": {}}).digest
    )
    with pytest.raises(Exception, match="policy_invalid"):
        parse_policy({"toolGuarantees": {"charge": "sometimes"}})
