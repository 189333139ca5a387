"""The approval challenge: MELRA's digest recipe and phrase, and every refusal in order."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import pytest

from maka_core.facts import canonical_json
from maka_core.governance.challenge import (
    ApprovalChallenge,
    action_digest,
    check_answer,
    issue_challenge,
    stable_json,
)

TASK = "11111111-1111-4111-8111-111111111111"
APPROVAL = "22222222-2222-4222-8222-222222222222"
OPERATION = {"kind": "file", "action": "write", "path": "a.txt", "content": "hi", "recursive": False}
# Written out by hand: keys sorted at every level, compact, no trailing newline.
LITERAL = (
    '{"operation":{"action":"write","content":"hi","kind":"file","path":"a.txt","recursive":false},'
    '"taskId":"11111111-1111-4111-8111-111111111111"}'
)
NOW = datetime(2026, 11, 30, 12, 0, 0, 250_000, tzinfo=UTC)


def test_action_digest_is_plain_sha256_hex_of_the_stable_json() -> None:
    expected = hashlib.sha256(LITERAL.encode("utf-8")).hexdigest()
    assert stable_json({"taskId": TASK, "operation": OPERATION}) == LITERAL
    assert action_digest(TASK, OPERATION) == expected
    assert len(expected) == 64 and not expected.startswith("sha256:")


def test_challenge_phrase_and_expiry() -> None:
    challenge = issue_challenge(TASK, OPERATION, now=NOW, ttl_ms=300_000, approval_id=APPROVAL)
    digest = hashlib.sha256(LITERAL.encode("utf-8")).hexdigest()
    assert challenge.phrase == "APPROVE " + digest[:12]
    assert challenge.action_digest == digest
    assert challenge.expires_at == "2026-11-30T12:05:00.250Z"
    assert challenge.model_dump(by_alias=True) == {
        "approvalId": APPROVAL,
        "taskId": TASK,
        "actionDigest": digest,
        "phrase": "APPROVE " + digest[:12],
        "expiresAt": "2026-11-30T12:05:00.250Z",
    }


def test_a_fresh_approval_id_each_time() -> None:
    a = issue_challenge(TASK, OPERATION, now=NOW, ttl_ms=1000)
    b = issue_challenge(TASK, OPERATION, now=NOW, ttl_ms=1000)
    assert a.approval_id != b.approval_id and a.phrase == b.phrase


def test_stable_json_sorts_integer_like_keys_as_strings_unlike_javascript_object_order() -> None:
    value = {"10": 1, "9": 2, "b": [1.5, None, True]}
    assert stable_json(value) == '{"10":1,"9":2,"b":[1.5,null,true]}'
    assert canonical_json.dumps(value) == '{"9":2,"10":1,"b":[1.5,null,true]}'


def test_the_digest_binds_the_task_and_every_field_of_the_operation() -> None:
    base = action_digest(TASK, OPERATION)
    assert action_digest(APPROVAL, OPERATION) != base
    assert action_digest(TASK, {**OPERATION, "content": "hj"}) != base
    assert action_digest(TASK, {**OPERATION, "recursive": True}) != base


@pytest.fixture
def challenge() -> ApprovalChallenge:
    return issue_challenge(TASK, OPERATION, now=NOW, ttl_ms=60_000, approval_id=APPROVAL)


def test_the_right_answer_in_time_for_the_same_action_approves(challenge: ApprovalChallenge) -> None:
    later = NOW + timedelta(seconds=59)
    assert check_answer(challenge, APPROVAL, challenge.phrase, later, action_digest(TASK, OPERATION)) is None


def test_every_refusal_code_in_melras_order(challenge: ApprovalChallenge) -> None:
    digest = action_digest(TASK, OPERATION)
    other = action_digest(TASK, {**OPERATION, "path": "b.txt"})
    expired = NOW + timedelta(seconds=60)  # at expiresAt is already expired
    wrong_id = "33333333-3333-4333-8333-333333333333"
    cases = [
        ((None, APPROVAL, challenge.phrase, NOW, digest), "approval_required"),
        ((challenge, None, challenge.phrase, NOW, digest), "approval_required"),
        ((challenge, APPROVAL, None, NOW, digest), "approval_required"),
        # everything wrong at once: the id is reported first, then phrase, expiry, digest
        ((challenge, wrong_id, "APPROVE 000000000000", expired, other), "approval_id_mismatch"),
        ((challenge, APPROVAL, "APPROVE 000000000000", expired, other), "approval_phrase_mismatch"),
        ((challenge, APPROVAL, challenge.phrase.lower(), NOW, digest), "approval_phrase_mismatch"),
        ((challenge, APPROVAL, challenge.phrase, expired, other), "approval_expired"),
        ((challenge, APPROVAL, challenge.phrase, NOW, other), "approval_action_digest_mismatch"),
    ]
    for args, code in cases:
        assert check_answer(*args) == code, code
