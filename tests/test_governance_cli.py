"""The governance commands without a server: a bad policy refused before anything starts, the
approval refusal codes at exit 2, receipts exported and verified (and a tampered export caught)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from maka_core.runtime import tool_call, turn
from maka_core.runtime.contracts import FinishRunInput
from maka_core.runtime.runtime import Runtime
from maka_core.settings import load_settings
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from maka_temporal.workers.client.policy import session_policy
from maka_temporal.workers.host.devserver import free_port
from tests.temporal_support import run_maka
from tests.test_governed_execution import CONFIRM, _until_pending, with_policy
from tests.test_runtime import ATTEMPT, IDS, one_call, run, tool_input


def maka(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MAKA_HOME": str(home), "TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}"}
    return run_maka(*args, env=env, timeout=60)


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        ({"mutations": "sometimes"}, "mutations"),
        (
            {"capabilities": [{"id": "g", "capability": "file.*", "effects": ["fly"]}]},
            "capabilities[0].effects[0]",
        ),
        ({"approvalTtlMs": "300000"}, "approvalTtlMs"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_a_bad_policy_is_refused_at_start_with_its_field(
    tmp_path: Path, policy: dict[str, Any], field: str
) -> None:
    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "p.json").write_text(json.dumps(policy))
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"steps": [{"text": "hi"}]}))
    out = maka(
        "session", "start", "--workspace", str(ws), "--script", str(script),
        "--policy", str(tmp_path / "p.json"), "--json", "hello", home=home,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    body = json.loads(out.stdout)
    assert (body["code"], body["field"]) == ("policy_invalid", field)
    assert not (home / "ledger.sqlite").exists()  # nothing was written
    bad_principal = maka(
        "session", "start", "--workspace", str(ws), "--script", str(script), "--principal", "robot:x",
        "--json", "hello", home=home,
    )  # fmt: skip
    assert bad_principal.returncode == 2 and json.loads(bad_principal.stdout)["code"] == "principal_invalid"


def test_an_unhinged_policy_needs_the_operators_second_key(tmp_path: Path) -> None:
    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "p.json").write_text(json.dumps({"unhinged": True}))
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"steps": [{"text": "hi"}]}))
    out = maka(
        "session", "start", "--workspace", str(ws), "--script", str(script),
        "--policy", str(tmp_path / "p.json"), "--json", "hello", home=home,
    )  # fmt: skip
    assert out.returncode == 2 and json.loads(out.stdout)["code"] == "unhinged_not_confirmed"
    # With the second key the policy is accepted (and the start then fails only for want of a server).
    keyed = maka(
        "session", "start", "--workspace", str(ws), "--script", str(script),
        "--policy", str(tmp_path / "p.json"), "--unhinged", "--json", "hello", home=home,
    )  # fmt: skip
    assert keyed.returncode == 2 and json.loads(keyed.stdout)["code"] == "temporal_unavailable"
    assert not (home / "ledger.sqlite").exists()  # a refused start writes nothing


@pytest.fixture
def pending(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A ledger in ``home`` holding one call of session s1 awaiting approval."""
    home = tmp_path / "home"
    home.mkdir()
    root = tmp_path / "ws"
    root.mkdir()
    ws = Workspace.open(root)
    store = LedgerStore.open(home / "ledger.sqlite")
    rt = Runtime(store)
    try:
        with_policy(rt, CONFIRM)
        ref = one_call(rt, ws, "write_file", {"path": "a.txt", "content": "x"})

        async def main() -> dict[str, Any]:
            task = asyncio.create_task(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
            found = await _until_pending(rt)
            task.cancel()
            return found

        return home, run(main())
    finally:
        rt.close()
        store.close()


def test_approve_and_deny_refusals_exit_2_with_their_codes(pending: tuple[Path, dict[str, Any]]) -> None:
    home, p = pending
    wrong_id = maka("session", "approve", "s1", "nope", "--phrase", p["phrase"], "--json", home=home)
    wrong_phrase = maka(
        "session", "approve", "s1", p["approvalId"], "--phrase", "APPROVE 123456789abc", "--json", home=home
    )
    # s2 is known to the ledger only by its recorded policy (as a session start leaves it); s3 not at all.
    session_policy(load_settings(db=str(home / "ledger.sqlite")), "s2", None, None, ()).record_in(
        load_settings(db=str(home / "ledger.sqlite"))
    )
    other_session = maka("session", "deny", "s2", p["approvalId"], "--json", home=home)
    unknown = [
        maka("session", "deny", "s3", p["approvalId"], "--json", home=home),
        maka("session", "approve", "s3", p["approvalId"], "--phrase", p["phrase"], "--json", home=home),
    ]
    answers = (wrong_id, wrong_phrase, other_session, *unknown)
    assert [o.returncode for o in answers] == [2, 2, 2, 2, 2]
    assert [json.loads(o.stdout)["code"] for o in answers] == [
        "approval_id_mismatch",
        "approval_phrase_mismatch",
        "approval_id_mismatch",
        "session_not_found",
        "session_not_found",
    ]
    human = maka("session", "approve", "s3", "x", "--phrase", p["phrase"], home=home)
    assert human.returncode == 2 and human.stderr == "error: session_not_found: no session s3\n"
    approved = maka(
        "session",
        "approve",
        "s1",
        p["approvalId"],
        "--phrase",
        p["phrase"],
        "--by",
        "alice",
        "--json",
        home=home,
    )
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["decision"] == "allow"
    twice = maka("session", "deny", "s1", p["approvalId"], "--json", home=home)
    assert twice.returncode == 2 and json.loads(twice.stdout)["code"] == "approval_not_pending"


def test_receipts_export_verifies_and_a_tampered_export_does_not(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    root = tmp_path / "ws"
    root.mkdir()
    ws = Workspace.open(root)
    none = maka("session", "receipts", "s1", "--json", home=home)
    assert none.returncode == 2 and json.loads(none.stdout)["code"] == "ledger_not_found"
    store = LedgerStore.open(home / "ledger.sqlite")
    empty = maka("session", "receipts", "s1", "--json", home=home)
    assert empty.returncode == 2 and json.loads(empty.stdout)["code"] == "receipts_not_found"
    rt = Runtime(store)
    try:
        ref = one_call(rt, ws, "write_file", {"path": "a.txt", "content": "x"})
        run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
        run(turn.finish_run(rt, FinishRunInput(ids=IDS, status="completed", ts=9)))
    finally:
        rt.close()
        store.close()
    exported = maka("session", "receipts", "s1", "--json", home=home)
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    assert [line["kind"] for line in lines] == ["action_receipt", "execution_certificate"]
    assert lines[1]["receiptIds"] == [lines[0]["receiptId"]] and lines[1]["result"] == "VERIFIED_SUCCESS"
    human = maka("session", "receipts", "s1", home=home)
    assert "verified_success" in human.stdout and "VERIFIED_SUCCESS" in human.stdout
    good = tmp_path / "receipts.jsonl"
    good.write_text(exported.stdout)
    checked = maka("receipts", "verify", str(good), "--json", home=home)
    assert checked.returncode == 0 and json.loads(checked.stdout) == {"ok": True, "lines": 2, "problems": []}
    bad = tmp_path / "tampered.jsonl"
    bad.write_text(exported.stdout.replace('"VERIFIED_SUCCESS"', '"PARTIAL"'))
    caught = maka("receipts", "verify", str(bad), "--json", home=home)
    assert caught.returncode == 1
    assert [p["code"] for p in json.loads(caught.stdout)["problems"]] == ["certificate_digest_mismatch"]
    missing = tmp_path / "missing.jsonl"
    missing.write_text(exported.stdout.splitlines()[1] + "\n")
    lost = maka("receipts", "verify", str(missing), "--json", home=home)
    assert [p["code"] for p in json.loads(lost.stdout)["problems"]] == ["certificate_receipt_missing"]
    for gone in (tmp_path / "no-such.jsonl", tmp_path):  # a missing file, a directory
        unread = maka("receipts", "verify", str(gone), "--json", home=home)
        assert unread.returncode == 2 and json.loads(unread.stdout)["code"] == "receipts_unreadable"
