"""Action receipts and per-turn execution certificates, each sealed by a digest.

A receipt records one governed action: who asked (the delegation chain), what was judged
(capability, effect, target, the policy decision and its version), what ran (``inputDigest`` of
the arguments), what was observed and which evidence held. A certificate closes a turn over its
receipts. MELRA seals only the certificate; we seal both, so ``verify_receipts`` can catch an
edited receipt as well as an edited certificate. Each ``digest`` is ``sha256:<hex>`` of the
canonical JSON of the object without its ``digest`` field; a file of receipts is JSON lines.
A certificate also carries its run's token usage (``usage``), sealed with the rest.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from maka_core.errors import CodecError
from maka_core.facts import canonical_json
from maka_core.facts.codec import digest as sha256_digest
from maka_core.governance.classify import GovernanceModel
from maka_core.governance.decision import Outcome
from maka_core.governance.evidence import CertificateResult, EvidenceItem
from maka_core.governance.guarantee import ExecutionGuarantee
from maka_core.tools.base import Effect

SCHEMA_VERSION: Literal["1.0.0"] = "1.0.0"
ProblemCode = Literal[
    "receipt_line_invalid", "receipt_digest_mismatch", "certificate_digest_mismatch",
    "receipt_id_duplicate", "certificate_receipt_missing",
]  # fmt: skip


class ReceiptPolicyDecision(GovernanceModel):
    outcome: Outcome
    policy_version: str
    policy_digest: str | None = None
    approval_id: str | None = None


class _Sealed(GovernanceModel):
    digest: str

    def body(self) -> dict[str, Any]:
        """The JSON object the digest covers: everything but ``digest``, absent optionals dropped."""
        value: dict[str, Any] = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        del value["digest"]
        return value

    def expected_digest(self) -> str:
        return sha256_digest(canonical_json.dumps(self.body()))

    def to_json(self) -> dict[str, Any]:
        return {**self.body(), "digest": self.digest}

    def to_line(self) -> str:
        return canonical_json.dumps(self.to_json())


class ActionReceipt(_Sealed):
    """One governed action; ``task_id`` is the operation id of the tool call."""

    kind: Literal["action_receipt"] = "action_receipt"
    schema_version: Literal["1.0.0"] = SCHEMA_VERSION
    receipt_id: str
    task_id: str
    capability: str
    principal: str  # the delegation chain, outermost first
    effect: Effect
    execution_guarantee: ExecutionGuarantee | None = None
    policy_decision: ReceiptPolicyDecision
    target: str
    input_digest: str
    started_at: str
    ended_at: str
    success: bool
    observed_effect: dict[str, Any]
    evidence: tuple[EvidenceItem, ...]
    redactions: tuple[str, ...] = ()
    error: str | None = None
    #: The MELRA task a ``melra_execute`` ran (absent for every other call).
    melra_task_id: str | None = None


class ExecutionCertificate(_Sealed):
    """The closing statement of one turn over the receipts of its actions."""

    kind: Literal["execution_certificate"] = "execution_certificate"
    schema_version: Literal["1.0.0"] = SCHEMA_VERSION
    certificate_id: str
    turn_id: str
    goal: str
    result: CertificateResult
    policy_version: str
    receipt_ids: tuple[str, ...]
    evidence: tuple[EvidenceItem, ...]
    created_at: str
    #: The run's token usage, summed over its model steps in Maka's ``tokenUsage`` names
    #: (``input``, ``output``, ``total``, ``cacheRead``...). Absent when no step reported usage,
    #: and in every certificate sealed before it existed: an absent field is outside the digest,
    #: so those still verify.
    usage: dict[str, int | float] | None = None


def receipt_id_for(operation_id: str) -> str:
    """The receipt id of an operation (one receipt per decided operation)."""
    return f"rcpt-{uuid.uuid5(uuid.NAMESPACE_URL, operation_id)}"


def seal_receipt(**fields: Any) -> ActionReceipt:
    """Build a receipt and compute its digest (fields by Python name)."""
    draft = ActionReceipt.model_validate({**fields, "digest": ""})
    return draft.model_copy(update={"digest": draft.expected_digest()})


def sealed_receipt_json(**fields: Any) -> dict[str, Any]:
    """``seal_receipt(**fields).to_json()``, dumping the receipt's body once instead of twice (the
    sealed copy differs from its draft only by the digest, which the body leaves out)."""
    body = ActionReceipt.model_validate({**fields, "digest": ""}).body()
    return {**body, "digest": sha256_digest(canonical_json.dumps(body))}


def seal_certificate(**fields: Any) -> ExecutionCertificate:
    """Build a certificate and compute its digest (fields by Python name)."""
    draft = ExecutionCertificate.model_validate({**fields, "digest": ""})
    return draft.model_copy(update={"digest": draft.expected_digest()})


@dataclass(frozen=True)
class ReceiptProblem:
    """One thing wrong in a receipts file: the 1-based line, a stable code, and why."""

    line: int
    code: ProblemCode
    message: str


def verify_receipts(lines: Iterable[str]) -> list[ReceiptProblem]:
    """Recompute every digest in a JSON-lines receipts file and check certificates' receipt ids.

    An empty list means every receipt and certificate is intact and every receipt a certificate
    names is present in the file.
    """
    problems: list[ReceiptProblem] = []
    seen: dict[str, int] = {}
    certificates: list[tuple[int, ExecutionCertificate]] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            value = canonical_json.loads(raw)
            kind = value.get("kind") if isinstance(value, dict) else None
            model: type[_Sealed] = ExecutionCertificate if kind == "execution_certificate" else ActionReceipt
            # Strict and by alias, as written: a retyped field is a different receipt.
            sealed = model.model_validate_json(canonical_json.dumps(value), strict=True, by_alias=True)
        except (CodecError, ValidationError) as exc:
            problems.append(ReceiptProblem(number, "receipt_line_invalid", str(exc).splitlines()[0]))
            continue
        if sealed.digest != sealed.expected_digest():
            code: ProblemCode = (
                "certificate_digest_mismatch"
                if isinstance(sealed, ExecutionCertificate)
                else "receipt_digest_mismatch"
            )
            problems.append(ReceiptProblem(number, code, "the digest does not match the content"))
        if isinstance(sealed, ActionReceipt):
            if sealed.receipt_id in seen:
                problems.append(
                    ReceiptProblem(
                        number,
                        "receipt_id_duplicate",
                        f"receipt {sealed.receipt_id} is also on line {seen[sealed.receipt_id]}",
                    )
                )
            seen.setdefault(sealed.receipt_id, number)
        elif isinstance(sealed, ExecutionCertificate):
            certificates.append((number, sealed))
    for number, certificate in certificates:
        for receipt_id in certificate.receipt_ids:
            if receipt_id not in seen:
                problems.append(
                    ReceiptProblem(
                        number, "certificate_receipt_missing", f"receipt {receipt_id} is not in the file"
                    )
                )
    return problems
