"""Receipts and certificates: camelCase, sealed by digests that verify_receipts recomputes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from maka_core.facts.codec import canonical_args_hash
from maka_core.governance.evidence import EvidenceItem
from maka_core.governance.policy_file import Identity, Principal
from maka_core.governance.receipts import (
    ActionReceipt,
    ExecutionCertificate,
    ReceiptPolicyDecision,
    seal_certificate,
    seal_receipt,
    verify_receipts,
)

IDENTITY = Identity(principal=Principal.parse("agent:local"), on_behalf_of=(Principal.parse("human:ann"),))
ITEM = EvidenceItem(type="file_exists", passed=True, summary="file exists", strength="state", source="a.txt")


def receipt(receipt_id: str = "r1", **over: Any) -> ActionReceipt:
    fields: dict[str, Any] = {
        "receipt_id": receipt_id,
        "task_id": "op-1",
        "capability": "file.write",
        "principal": IDENTITY.chain,
        "effect": "mutate",
        "execution_guarantee": "reconciliation-required",
        "policy_decision": ReceiptPolicyDecision(outcome="confirm", policy_version="v1", approval_id="ap-1"),
        "target": "a.txt",
        "input_digest": canonical_args_hash("write_file", {"path": "a.txt", "content": "x"}),
        "started_at": "2026-11-30T12:00:00.000Z",
        "ended_at": "2026-11-30T12:00:00.010Z",
        "success": True,
        "observed_effect": {"bytes": 1},
        "evidence": (ITEM,),
        **over,
    }
    return seal_receipt(**fields)


def certificate(receipt_ids: tuple[str, ...] = ("r1",)) -> ExecutionCertificate:
    return seal_certificate(
        certificate_id="c1",
        turn_id="turn-1",
        goal="write a.txt",
        result="VERIFIED_SUCCESS",
        policy_version="v1",
        receipt_ids=receipt_ids,
        evidence=(ITEM,),
        created_at="2026-11-30T12:00:01.000Z",
    )


def test_receipt_is_camel_case_and_its_digest_is_sha256_of_the_rest() -> None:
    r = receipt()
    wire = r.to_json()
    assert wire["principal"] == "human:ann/agent:local"
    assert wire["policyDecision"] == {"outcome": "confirm", "policyVersion": "v1", "approvalId": "ap-1"}
    assert {
        "receiptId",
        "taskId",
        "inputDigest",
        "startedAt",
        "endedAt",
        "observedEffect",
        "redactions",
    } <= set(wire)
    assert "error" not in wire
    body = {k: v for k, v in wire.items() if k != "digest"}
    # ASCII only and no integer-like keys: the canonical form is sorted compact JSON here.
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    assert r.digest == "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def test_certificate_digest() -> None:
    c = certificate()
    body = {k: v for k, v in c.to_json().items() if k != "digest"}
    assert body["receiptIds"] == ["r1"] and body["kind"] == "execution_certificate"
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    assert c.digest == "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def test_an_intact_file_verifies(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    path.write_text(
        "\n".join([receipt("r1").to_line(), receipt("r2").to_line(), certificate(("r1", "r2")).to_line()])
    )
    assert verify_receipts(path.read_text().splitlines()) == []


def _tamper(line: str, **changes: Any) -> str:
    value = json.loads(line)
    value.update(changes)
    return json.dumps(value)


def test_tampered_receipt_and_certificate_are_caught() -> None:
    good_r, good_c = receipt().to_line(), certificate().to_line()
    problems = verify_receipts([_tamper(good_r, success=False), good_c])
    assert [(p.line, p.code) for p in problems] == [(1, "receipt_digest_mismatch")]
    problems = verify_receipts([good_r, _tamper(good_c, result="PARTIAL")])
    assert [(p.line, p.code) for p in problems] == [(2, "certificate_digest_mismatch")]
    # an edit deep in the evidence is caught too
    value = json.loads(good_r)
    value["evidence"][0]["passed"] = False
    assert [p.code for p in verify_receipts([json.dumps(value)])] == ["receipt_digest_mismatch"]


def test_structural_problems() -> None:
    good = receipt().to_line()
    problems = verify_receipts(
        [
            good,
            good,  # the same receipt twice
            "not json",
            _tamper(good, success="true"),  # retyped: strict parsing refuses it
            _tamper(good, extra=1),
            certificate(("r1", "r9")).to_line(),
            "",
        ]
    )
    assert [(p.line, p.code) for p in problems] == [
        (2, "receipt_id_duplicate"),
        (3, "receipt_line_invalid"),
        (4, "receipt_line_invalid"),
        (5, "receipt_line_invalid"),
        (6, "certificate_receipt_missing"),
    ]
