"""The offline command's pure core: INPUT document in, the reference planner's JSON out.

The worked example's digests are the reference's own (``maka-continuation-facts.md`` §5.9), so
these tests pin the byte recipes, not just their shape.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from maka_core.errors import ConfigError
from maka_core.ledger.continuation_document import plan_continuation_document

WORKED_LEDGER = [
    json.loads(line)
    for line in (
        '{"author":"user","content":{"kind":"text","text":"hi"},"id":"e-1","invocationId":"i-1",'
        '"partial":false,"role":"user","runId":"r-1","sessionId":"s-1","ts":1,"turnId":"t-1"}',
        '{"author":"agent","content":{"args":{"path":"a.txt"},"id":"c-1","kind":"function_call",'
        '"name":"Read"},"id":"e-2","invocationId":"i-1","partial":false,"role":"model","runId":"r-1",'
        '"sessionId":"s-1","ts":2,"turnId":"t-1"}',
        '{"author":"tool","content":{"id":"c-1","kind":"function_response","name":"Read","result":'
        '{"content":"A"}},"id":"e-3","invocationId":"i-1","partial":false,"role":"tool","runId":"r-1",'
        '"sessionId":"s-1","ts":3,"turnId":"t-1"}',
        '{"actions":{"endInvocation":true,"stateDelta":{"failureClass":"app_restarted"}},"author":"system",'
        '"id":"e-4","invocationId":"i-1","partial":false,"role":"system","runId":"r-1","sessionId":"s-1",'
        '"status":"failed","ts":4,"turnId":"t-1"}',
    )
]
PREFIX = "sha256:a45fb5bfaa3ef78829983f1a42dcda9fc10cfebe71a0a3153d8396da547d8c16"
MANIFEST = "sha256:28f9f54dbc1d9f7b58f35ce1aeaadc4c794e8ccea5991002ee2c658f87fb25fc"
REPLAY = "sha256:88d229de548b197f79cd66731a7328f79570365623937ee5ae008fadcf436190"
WS = "workspace:v1:0b9e7c1a-1111-4222-8333-944455556666"


def worked(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "sessionId": "s-1",
        "sourceRunId": "r-1",
        "observation": {
            "currentCwd": "C:\\Work\\App\\",
            "sourceWorkspaceIdentity": WS,
            "currentWorkspaceIdentity": WS,
            "backgroundOperationsSettled": True,
            "availableToolNames": ["Read"],
        },
        "runs": {
            "r-1": {
                "runId": "r-1",
                "invocationId": "i-1",
                "sessionId": "s-1",
                "turnId": "t-1",
                "status": "failed",
                "failureClass": "app_restarted",
                "cwd": "c:/work/app",
                "workspaceIdentity": WS,
            }
        },
        "ledgers": {"r-1": copy.deepcopy(WORKED_LEDGER)},
    }
    doc.update(over)
    return doc


def test_the_worked_example_matches_the_reference_digests() -> None:
    result = plan_continuation_document(worked(ids=["i-2", "r-2", "t-2", "k-2"]))
    assert result["disposition"] == "continue" and result["diagnostics"] == []
    c = result["continuation"]
    (segment,) = c["boundary"]["segments"]
    assert segment["prefixDigest"] == PREFIX
    assert c["boundary"]["manifestDigest"] == MANIFEST
    assert c["providerReplayDigest"] == REPLAY
    assert [e["id"] for e in c["runtimeContext"]] == ["e-1", "e-2", "e-3", "e-4"]
    assert c["runtimeContext"] == WORKED_LEDGER
    assert c["claimId"] == "k-2" and c["sourceRuntimeEventHighWater"] == 4


def test_ids_fall_back_to_generated_and_an_empty_claim_id_is_omitted() -> None:
    c = plan_continuation_document(worked(ids=["i-2"]))["continuation"]
    assert (c["invocationId"], c["runId"], c["turnId"], c["claimId"]) == (
        "i-2",
        "generated-1",
        "generated-2",
        "generated-3",
    )
    c = plan_continuation_document(worked(ids=["i-2", "r-2", "t-2", ""]))["continuation"]
    assert "claimId" not in c


def test_a_park_has_no_continuation_and_no_null_keys() -> None:
    doc = worked()
    doc["observation"]["backgroundOperationsSettled"] = False
    result = plan_continuation_document(doc)
    assert result == {
        "disposition": "park",
        "rejectionReasons": ["background_operation_pending"],
        "diagnostics": [
            {"code": "background_operation_pending", "message": result["diagnostics"][0]["message"]}
        ],
    }


def test_a_failure_class_that_disagrees_with_the_terminal_fact_is_terminal_repair_failed() -> None:
    doc = worked()
    doc["runs"]["r-1"]["failureClass"] = "other"
    assert plan_continuation_document(doc)["rejectionReasons"] == ["terminal_repair_failed"]


def host(**over: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "featureEnabled": True,
        "inspectorConfigured": True,
        "sessionCwd": "c:/work/app",
        "observation": {
            "workspaceIdentity": WS,
            "backgroundOperationsSettled": True,
            "availableToolNames": ["Read"],
        },
    }
    value.update(over)
    return value


@pytest.mark.parametrize(
    ("host_over", "runs_over", "reason"),
    [
        ({"featureEnabled": False}, None, "resume_feature_disabled"),
        ({"inspectorConfigured": False}, None, "safety_observation_unavailable"),
        ({}, {}, "source_run_unreadable"),
        ({}, {"r-1": {"runId": "r-1", "status": "failed"}}, "workspace_identity_missing"),
        ({"observation": None}, None, "safety_observation_unavailable"),
    ],
)
def test_host_checks_park_in_order(host_over: dict[str, Any], runs_over: Any, reason: str) -> None:
    doc = worked(host=host(**host_over))
    if runs_over is not None:
        doc["runs"] = runs_over
    result = plan_continuation_document(doc)
    assert result["rejectionReasons"] == [reason]
    assert list(result["diagnostics"][0]) == ["code", "message"]


def test_the_host_observation_replaces_the_document_observation() -> None:
    doc = worked(host=host(expectedRuntimeEventHighWater=3))
    del doc["observation"]
    result = plan_continuation_document(doc)
    assert result["rejectionReasons"] == ["runtime_offset_mismatch"]
    assert result["diagnostics"][0]["detail"] == {"expected": 3, "actual": 4}
    assert plan_continuation_document(worked(host=host()))["disposition"] == "continue"


def test_claim_authority_states() -> None:
    assert plan_continuation_document(worked(continuationClaims="unavailable"))["rejectionReasons"] == [
        "continuation_authority_unavailable"
    ]
    stale = {MANIFEST: {"claim": {"claimId": "k-1", "boundaryDigest": MANIFEST, "target": {"runId": "r-9"}}}}
    result = plan_continuation_document(worked(continuationClaims=stale))
    assert result["rejectionReasons"] == ["continuation_claim_repair_required"]
    assert result["diagnostics"][0]["detail"] == {"continuationClaimId": "k-1", "continuationRunId": "r-9"}
    listed = [{"runId": "r-7", "sourceRunId": "r-1", "sourceRuntimeEventHighWater": 4}]
    result = plan_continuation_document(worked(findExistingContinuation=listed))
    assert result["diagnostics"][0]["detail"] == {"continuationRunId": "r-7"}


@pytest.mark.parametrize(
    "breaking",
    [
        lambda d: d.pop("sessionId"),
        lambda d: d.update(runs=[]),
        lambda d: d.update(ledgers=None),
        lambda d: d["observation"].pop("backgroundOperationsSettled"),
        lambda d: d["observation"].update(availableToolNames="Read"),
        lambda d: d.update(ids=[1, 2]),
        lambda d: d.update(continuationClaims=[]),
        lambda d: d.update(findExistingContinuation="sometimes"),
        lambda d: d["observation"].update(workspaceCheckpoint={"ref": "x"}),
        lambda d: d.pop("observation"),
    ],
)
def test_bad_input_raises_a_stable_code(breaking: Any) -> None:
    doc = worked()
    breaking(doc)
    with pytest.raises(ConfigError) as info:
        plan_continuation_document(doc)
    assert info.value.code == "continuation_input_invalid"


def test_an_undecodable_event_makes_the_ledger_unreadable_not_the_input_invalid() -> None:
    doc = worked()
    doc["ledgers"]["r-1"][1]["surprise"] = True
    assert plan_continuation_document(doc)["rejectionReasons"] == ["runtime_ledger_unreadable"]


# --- the offline command: `maka ledger plan-continuation INPUT.json --json` -------------------------


def _plan_cli(tmp_path: Path, doc: Any, *flags: str) -> Any:
    from click.testing import CliRunner

    from maka_temporal.workers.cli.app import maka

    path = tmp_path / "input.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return CliRunner().invoke(
        maka, ["ledger", "plan-continuation", str(path), *flags], catch_exceptions=False
    )


def test_the_command_prints_the_planners_result_and_exits_0_on_continue(tmp_path: Path) -> None:
    result = _plan_cli(tmp_path, worked(ids=["i-2", "r-2", "t-2", "k-2"]), "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out == plan_continuation_document(worked(ids=["i-2", "r-2", "t-2", "k-2"]))
    assert out["continuation"]["providerReplayDigest"] == REPLAY


def test_the_command_exits_1_on_park_with_the_reasons(tmp_path: Path) -> None:
    doc = worked()
    doc["observation"]["currentWorkspaceIdentity"] = "workspace:v1:00000000-0000-4000-8000-000000000000"
    result = _plan_cli(tmp_path, doc, "--json")
    assert result.exit_code == 1
    assert json.loads(result.output)["rejectionReasons"] == ["workspace_identity_mismatch"]
    human = _plan_cli(tmp_path, doc)
    assert human.exit_code == 1 and "rejected: workspace_identity_mismatch" in human.output


def test_the_command_refuses_bad_input_with_exit_2_and_a_code(tmp_path: Path) -> None:
    for bad in ('{"sessionId": NaN}', "[1, 2]", '{"sessionId": "s-1"}'):
        result = _plan_cli(tmp_path, bad, "--json")
        assert result.exit_code == 2, (bad, result.output)
        assert json.loads(result.output)["code"] == "continuation_input_invalid", bad


def test_the_command_reads_minus_zero_as_javascript_does(tmp_path: Path) -> None:
    """Issue 23: the document is read with JSON.parse's rules, not the ledger's lossless rule, so
    ``-0`` plans (here a park, ``-0 !== 4``) and is printed ``0``; the ledger's rule stays."""
    doc = worked()
    doc["observation"]["expectedRuntimeEventHighWater"] = "@HW@"
    text = json.dumps(doc).replace('"@HW@"', "-0")
    result = _plan_cli(tmp_path, text, "--json")
    assert result.exit_code == 1, result.output
    assert '"detail": {"expected": 0, "actual": 4}' in result.output
    assert json.loads(result.output)["rejectionReasons"] == ["runtime_offset_mismatch"]
    # Negative control: the same value inside a ledger row is still refused by the ledger's rule.
    from maka_core.errors import CodecError
    from maka_core.facts import codec

    line = json.dumps(WORKED_LEDGER[0]).replace('"ts": 1', '"ts": -0')
    with pytest.raises(CodecError):
        codec.decode(line)
