"""After a governed call's effect, before T2: its evidence verified, its result told, its receipt sealed.

The decision's evidence predicates are evaluated against what the tool reported and the
workspace now (``verify``; a probe confined to the workspace, ``probe_in``), a succeeded tool
whose predicate failed becomes ``partial`` in the result the model sees (``told``), and the sealed
``ActionReceipt`` is built for T2 (``receipt``; a refusal's too, and a recovery redo's).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from maka_core.errors import MakaError
from maka_core.facts import canonical_json
from maka_core.facts.codec import digest as sha256_digest
from maka_core.governance import EvidenceItem, ProbedFile, ToolObservation, evaluate, verification_status
from maka_core.governance.challenge import iso_ms
from maka_core.governance.evidence import TaskStatus
from maka_core.governance.receipts import receipt_id_for, sealed_receipt_json
from maka_core.runtime.governed import SessionGovernance, required_evidence
from maka_core.tools import ToolResult
from maka_core.workspace import Workspace


def observation(result: ToolResult) -> ToolObservation:
    """What predicates read: the JSON value (or ``{"text": ...}``) and a command's exit code."""
    raw = result.result if isinstance(result.result, dict) else {}
    value: Any = raw.get("value") if raw.get("kind") == "json" else {"text": raw.get("text")}
    code = value.get("exitCode") if isinstance(value, dict) else None
    return ToolObservation(
        result=value, exit_code=code if isinstance(code, int) else None, is_error=result.is_error
    )


def probe_in(ws: Workspace, *, hashes: bool = True) -> Any:
    """A read-only file probe confined to the workspace (an escape is a failed item, never a read);
    it reads a file's bytes only when some predicate compares a hash."""

    def probe(path: str) -> ProbedFile:
        target = ws.resolve(path)  # ToolRefusal (a MakaError) for a path outside the workspace
        if not target.exists():
            return ProbedFile(exists=False)
        if not hashes or not target.is_file():
            return ProbedFile(exists=True)
        try:
            return ProbedFile(exists=True, sha256=hashlib.sha256(target.read_bytes()).hexdigest())
        except OSError as exc:
            raise MakaError("evidence_unreadable", str(exc.strerror)) from None

    return probe


def verify(
    record: Mapping[str, Any], result: ToolResult, ws: Workspace
) -> tuple[TaskStatus, tuple[EvidenceItem, ...]]:
    """Evaluate the decision's predicates against what the tool reported and the workspace now."""
    predicates = required_evidence(record)
    hashes = any(p.type == "file_hash" for p in predicates)
    items = evaluate(predicates, observation(result), probe_in(ws, hashes=hashes))
    return verification_status(not result.is_error, items), items


def redactions_of(result: ToolResult) -> tuple[str, ...]:
    """What the receipt says was left out of the result: the streams a task's ``maxOutputChars``
    cut (the result itself carries ``truncated``)."""
    raw = result.result if isinstance(result.result, dict) else {}
    value = raw.get("value") if raw.get("kind") == "json" else None
    if not isinstance(value, dict) or value.get("truncated") is not True:
        return ()
    limit = value.get("maxOutputChars")
    return tuple(f"{s}:truncated:{limit}" for s in value.get("truncatedStreams", ()) if isinstance(s, str))


def told(result: ToolResult, status: TaskStatus, items: tuple[EvidenceItem, ...]) -> ToolResult:
    """The result the model sees: a succeeded tool whose evidence failed says it is ``partial``."""
    if status != "partial":
        return result
    failed = [
        {"type": i.type, "summary": i.summary, **({"source": i.source} if i.source else {})}
        for i in items
        if not i.passed
    ]
    verification = {"status": "partial", "failedEvidence": failed}
    raw = result.result if isinstance(result.result, dict) else {}
    if raw.get("kind") == "json" and isinstance(raw.get("value"), dict):
        return ToolResult.json({**raw["value"], "verification": verification})
    return ToolResult.json({"result": raw.get("value", raw.get("text")), "verification": verification})


def receipt(
    *,
    operation_id: str,
    gov: SessionGovernance,
    record: Mapping[str, Any],
    args: Mapping[str, Any],
    started_ms: int,
    ended_ms: int,
    status: TaskStatus,
    items: tuple[EvidenceItem, ...] = (),
    error: str | None = None,
    redactions: tuple[str, ...] = (),
    attempts: int | None = None,
    redo: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The sealed ``ActionReceipt`` of one decided call, as JSON; ``attempts`` (a call whose
    guarantee let it run again) lists its runs in ``observedEffect``, and a recovery redo what it
    observed and did (``redo``)."""
    return sealed_receipt_json(
        receipt_id=receipt_id_for(operation_id),
        task_id=operation_id,
        capability=record["capability"],
        principal=gov.identity.chain,
        effect=record["effect"],
        execution_guarantee=record.get("executionGuarantee"),
        policy_decision={
            "outcome": record["outcome"],
            "policy_version": record["policyVersion"],
            "policy_digest": record["policyDigest"],
            "approval_id": record.get("challenge", {}).get("approvalId") or record.get("presentedApprovalId"),
        },
        target=record["target"],
        input_digest=sha256_digest(canonical_json.dumps(dict(args))),
        started_at=_iso(started_ms),
        ended_at=_iso(ended_ms),
        success=status == "verified_success",
        observed_effect={
            "status": status,
            **({"network": True} if record.get("network") is True else {}),
            **({"attempts": list(range(1, attempts + 1))} if attempts is not None else {}),
            **({"redo": dict(redo)} if redo is not None else {}),
        },
        evidence=items,
        redactions=redactions,
        error=error,
        melra_task_id=record.get("melraTaskId"),
    )


def _iso(ms: int) -> str:
    return iso_ms(datetime.fromtimestamp(ms / 1000, tz=UTC))


__all__ = ["observation", "probe_in", "receipt", "redactions_of", "told", "verify"]
