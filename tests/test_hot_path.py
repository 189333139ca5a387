"""The ledger hot path's shortcuts give exactly what the long way gives.

Each shortcut on the per-call path (``benchmarks/ledger_bench.py --runtime-calls``) is checked
against the computation it replaces: the lossless check without re-parsing a plain line, the
admitted batch kept folded, a call's args hash computed once, the receipt body dumped once, a
policy digest computed once, one kept writer connection. Real SQLite files throughout.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text as sql_text

from maka_core.errors import CodecError, LedgerRejection
from maka_core.facts import canonical_json, codec
from maka_core.facts.events import TextContent
from maka_core.governance import seal_receipt
from maka_core.governance.receipts import ActionReceipt, ReceiptPolicyDecision, sealed_receipt_json
from maka_core.ledger.lanes import args_hash_or_none
from maka_core.ledger.scanner import scan
from maka_core.runtime.governed import DEFAULT_SESSION_POLICY
from maka_core.store.writer import LedgerStore
from tests.ledger_factory import SESSION, call, response, t1, text, user


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LedgerStore]:
    with LedgerStore.open(tmp_path / "ledger.sqlite") as opened:
        yield opened


@pytest.mark.parametrize(
    "value",
    [
        {"path": "a.txt", "n": 3, "ok": True, "none": None, "list": ["x", {"y": [1, 2]}]},
        {"text": 'é ü 中文 \u2028 \x00 "quoted" \\', "big": 10**15 - 1},
        [],
        "plain",
    ],
)
def test_plain_values_parse_back_to_themselves(value: Any) -> None:
    line, plain = canonical_json.dumps_plain(value)
    assert plain
    assert line == canonical_json.dumps(value)
    parsed = canonical_json.loads(line)
    assert parsed == value
    assert _types(parsed) == _types(value)


@pytest.mark.parametrize(
    "value",
    [{"x": 1.5}, {"x": 10**15}, {"10": "index key"}, {"ключ": 1}, {"s": "\U0001f600"}, 2.0],
)
def test_values_the_c_encoder_may_not_match_are_not_plain(value: Any) -> None:
    line, plain = canonical_json.dumps_plain(value)
    assert not plain
    assert line == canonical_json.dumps(value)


def _types(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value)


def test_a_non_lossless_event_is_still_refused(store: LedgerStore) -> None:
    store.append([user()])
    good = text("same")
    assert isinstance(good.content, TextContent)
    # displayText equal to text is dropped on decode (the reference's normalization), so this event
    # would not mean the same after a round trip; model_copy skips the validator that drops it.
    lossy = good.model_copy(update={"content": good.content.model_copy(update={"display_text": "same"})})
    with pytest.raises(CodecError) as refused:
        store.append([lossy])
    assert refused.value.code == "runtime_event_not_lossless"
    store.append([good])  # negative control: the same event without the stray key lands
    assert store.event(good.id) == good


def test_events_with_non_plain_args_take_the_parsing_path_and_land_canonical(store: LedgerStore) -> None:
    store.append([user()])
    floaty = call("c1", "Bash", {"ratio": 0.5, "huge": 2**60, "1": "index"}, operation_id="op-c1")
    store.append([floaty])
    stored = store.event(floaty.id)
    assert stored is not None and codec.encode(stored) == codec.encode(floaty)


def test_kept_fold_equals_a_fresh_scan_of_the_ledger(store: LedgerStore) -> None:
    store.append([user()])
    for k in range(3):
        c, d = t1(f"c{k}", recovery_mode="reconcile")
        store.commit_tool_prepared(d, call=c, evidence={"path": "a.txt"})
        store.commit_tool_outcome(response(f"c{k}"))
    with pytest.raises(LedgerRejection):  # a refused batch leaves nothing folded behind
        store.commit_tool_outcome(response("c9"))  # an outcome for a call that never crossed T1
    live = store.view(SESSION).scanner
    fresh = scan(store.events())
    assert live.issues == fresh.issues == []
    assert live.event_count == fresh.event_count
    assert [f.operation_id for f in live.operations()] == [f.operation_id for f in fresh.operations()]
    assert [f.state for f in live.operations()] == [f.state for f in fresh.operations()]


def test_call_args_hash_is_the_args_hash_of_that_very_call() -> None:
    first = call("c1", "write_file", {"path": "a.txt", "content": "x"}, operation_id="op-c1")
    scanner = scan([user(), first])
    assert scanner.call_args_hash(first) == args_hash_or_none("write_file", {"path": "a.txt", "content": "x"})
    # Another event under the same id (never folded) is hashed for itself, not served the cached hash.
    other = call("c1", "write_file", {"path": "b.txt", "content": "y"}, operation_id="op-c1")
    assert scanner.call_args_hash(other) == args_hash_or_none("write_file", {"path": "b.txt", "content": "y"})
    assert scanner.call_args_hash(user()) is None


def test_a_dispatch_whose_hash_disagrees_with_its_call_is_still_corruption() -> None:
    c, d = t1("c1", recovery_mode="reconcile")
    assert d.actions is not None and d.actions.tool_dispatch is not None
    wrong = d.actions.tool_dispatch.model_copy(update={"canonical_args_hash": "sha256:" + "0" * 64})
    bad = d.model_copy(update={"actions": d.actions.model_copy(update={"tool_dispatch": wrong})})
    assert [i.code for i in scan([user(), c, bad]).issues] == ["canonical_args_hash_conflict"]
    assert scan([user(), c, d]).issues == []  # negative control


def test_sealed_receipt_json_is_the_sealed_receipts_json() -> None:
    fields: dict[str, Any] = {
        "receipt_id": "r1",
        "task_id": "op-1",
        "capability": "file.read",
        "principal": "agent:local",
        "effect": "read",
        "policy_decision": ReceiptPolicyDecision(outcome="allow", policy_version="v1"),
        "target": "a.txt",
        "input_digest": "sha256:" + "ab" * 32,
        "started_at": "2026-11-30T12:00:00.000Z",
        "ended_at": "2026-11-30T12:00:00.010Z",
        "success": True,
        "observed_effect": {"status": "verified_success"},
        "evidence": (),
    }
    value = sealed_receipt_json(**fields)
    assert value == seal_receipt(**fields).to_json()
    assert list(value) == list(seal_receipt(**fields).to_json())
    again = ActionReceipt.model_validate(value)
    assert again.digest == again.expected_digest()


def test_a_policy_digest_is_computed_once_and_afresh_for_a_copy() -> None:
    policy = DEFAULT_SESSION_POLICY
    expected = codec.digest(canonical_json.dumps(policy.to_json()))
    assert policy.digest == expected
    assert policy.digest is policy.digest
    changed = policy.model_copy(update={"mutations": "deny"})
    assert changed.digest == codec.digest(canonical_json.dumps(changed.to_json())) != expected


def test_the_kept_writer_connection_is_dropped_after_a_failed_write(store: LedgerStore) -> None:
    store.append([user()])
    kept = store._kept
    assert kept is not None
    with kept() as conn:
        first = conn
    with kept() as conn:
        assert conn is first  # reused between writes
    with pytest.raises(LedgerRejection):
        store.append([t1("c9")[1]])  # a dispatch through the generic writer is refused
    with kept() as conn:
        assert conn is not first and not conn.closed
        assert conn.execute(sql_text("SELECT 1")).scalar() == 1
        conn.rollback()
    store.append([text("after")])  # the next write takes a fresh connection and lands
    assert store.event("evt-model-1") is not None


def test_view_on_the_kept_connection_sees_another_writers_commits(tmp_path: Path) -> None:
    with LedgerStore.open(tmp_path / "l.sqlite") as mine, LedgerStore.open(tmp_path / "l.sqlite") as other:
        mine.append([user()])
        assert mine._kept is not None and mine._kept.idle_driver() is not None  # the read uses it
        other.view(SESSION)
        other.append([text("from the other writer")])
        assert mine.view(SESSION).scanner.position("evt-model-1") == 1
        mine.append([text("mine", id="evt-model-2")])  # its writer transaction follows the read
        assert [e.id for e in other.events()] == ["evt-user-1", "evt-model-1", "evt-model-2"]
