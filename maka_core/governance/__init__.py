"""Governed execution after MELRA: policy file, classification, decision, approval challenge,
evidence, execution guarantee and receipts. Pure: no store, no Temporal, no I/O beyond reading
a policy file and whatever file probe the caller passes in."""

from maka_core.governance.challenge import ApprovalChallenge, action_digest, check_answer, issue_challenge
from maka_core.governance.classify import Classification, classify_bash, classify_declared, classify_operation
from maka_core.governance.decision import (
    DECISION_ORDER,
    GovernedCall,
    PolicyDecision,
    decide,
    governed_call,
    policy_blocked_result,
)
from maka_core.governance.evidence import (
    EvidenceItem,
    EvidencePredicate,
    ProbedFile,
    TaskStatus,
    ToolObservation,
    default_evidence_for,
    evaluate,
    is_success,
    verification_status,
)
from maka_core.governance.guarantee import (
    ExecutionGuarantee,
    allows_retry,
    guarantee_for_tool,
    restart_action,
    retry_allowed,
)
from maka_core.governance.policy_file import (
    LOCAL_IDENTITY,
    GovernancePolicy,
    Identity,
    Principal,
    load_policy,
    parse_policy,
)
from maka_core.governance.receipts import (
    ActionReceipt,
    ExecutionCertificate,
    ReceiptProblem,
    seal_certificate,
    seal_receipt,
    verify_receipts,
)

__all__ = [
    "DECISION_ORDER",
    "LOCAL_IDENTITY",
    "ActionReceipt",
    "ApprovalChallenge",
    "Classification",
    "EvidenceItem",
    "EvidencePredicate",
    "ExecutionCertificate",
    "ExecutionGuarantee",
    "GovernancePolicy",
    "GovernedCall",
    "Identity",
    "PolicyDecision",
    "Principal",
    "ProbedFile",
    "ReceiptProblem",
    "TaskStatus",
    "ToolObservation",
    "action_digest",
    "allows_retry",
    "check_answer",
    "classify_operation",
    "classify_bash",
    "classify_declared",
    "decide",
    "default_evidence_for",
    "evaluate",
    "governed_call",
    "guarantee_for_tool",
    "is_success",
    "issue_challenge",
    "load_policy",
    "parse_policy",
    "policy_blocked_result",
    "restart_action",
    "retry_allowed",
    "seal_certificate",
    "seal_receipt",
    "verification_status",
    "verify_receipts",
]
