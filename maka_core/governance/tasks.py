"""MELRA tasks: ``melra_plan``'s request, the plan it returns, and the task controller's rules.

Pure: the request schema (the seed's exact input fields), the plan (classification, default
evidence, MELRA's decision, the scoped challenge; nothing runs), the mapping of a planned
operation onto the one of our tools that performs it, a task's status derived from its
executions, and the execute-time refusals (a duplicate attempt, an exhausted budget).

Only the ``file`` and ``terminal`` kinds run here, and of those only the actions an existing tool
performs (``file.read``/``list``/``write``, ``terminal.run``); every other kind or action is
refused before a task exists, with a code naming it, so a plan never promises what no tool can do.
The task id is ``uuid5`` of the planning call's operation id: a re-run of the same call (recovery
reading again) finds the task it already persisted instead of making a second one.
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, ValidationError

from maka_core.errors import CodecError, MakaError
from maka_core.facts import canonical_json
from maka_core.governance.challenge import ApprovalChallenge, issue_challenge
from maka_core.governance.classify import Classification, GovernanceModel, classify_operation
from maka_core.governance.commands import ProgramLookup
from maka_core.governance.decision import PolicyDecision, decide, governed_call
from maka_core.governance.evidence import EvidencePredicate, TaskStatus
from maka_core.governance.guarantee import ExecutionGuarantee, task_guarantee
from maka_core.governance.policy_file import GovernancePolicy, Identity
from maka_core.tools.base import Effect

#: What ``melra_plan`` answers (a subset of ``TaskStatus``).
PlanStatus = Literal["planned", "awaiting_approval", "policy_blocked"]
#: Why a request is refused before any task exists (an ordinary error result, nothing persisted).
#: ``identity_not_session_principal`` is ours: a request may name the delegation chain behind the
#: session's principal, never another principal (whose grants policy would then match).
RequestRefusal = Literal[
    "task_request_invalid", "operation_kind_not_supported", "operation_action_not_supported",
    "identity_not_session_principal",
]  # fmt: skip
#: The task controller's refusals at execute time (MELRA's strings).
TaskError = Literal[
    "task_not_found", "task_budget_exhausted", "duplicate_attempt_prevented", "receipt_not_found",
    "task_or_receipt_required",
]  # fmt: skip

TASK_NAMESPACE = uuid.UUID("6d3c1f0e-5b7a-4c2e-9f61-2a8e4b0d7c15")
RUNNABLE: frozenset[str] = frozenset({"file.read", "file.list", "file.write", "terminal.run"})

_Text = Annotated[str, StringConstraints(min_length=1, max_length=4096)]


class Budget(GovernanceModel):
    """MELRA's bounds and defaults; ``max_retries`` counts for reads only."""

    max_steps: int = Field(default=10, ge=1, le=100)
    max_duration_ms: int = Field(default=120_000, ge=100, le=900_000)
    max_retries: int = Field(default=2, ge=0, le=10)


class FileOperation(GovernanceModel):
    kind: Literal["file"]
    action: Literal["list", "read", "stat", "hash", "write", "move", "mkdir", "delete"]
    path: _Text
    destination: _Text | None = None
    content: Annotated[str, StringConstraints(max_length=10 * 1024 * 1024)] | None = None
    encoding: Literal["utf8", "base64"] = "utf8"
    recursive: bool = False


class TerminalOperation(GovernanceModel):
    kind: Literal["terminal"]
    action: Literal["run", "start", "status", "output", "stop", "send"]
    command: _Text | None = None
    args: tuple[Annotated[str, StringConstraints(max_length=4096)], ...] = Field(default=(), max_length=200)
    job_id: _Text | None = None
    cwd: _Text | None = None
    env: dict[str, str] | None = None
    interactive: bool = False
    input: str | None = None
    append_newline: bool = True
    timeout_ms: int | None = Field(default=None, ge=1, le=120_000)
    max_output_chars: int | None = Field(default=None, ge=1)


Operation = Annotated[FileOperation | TerminalOperation, Field(discriminator="kind")]


class TaskRequest(GovernanceModel):
    """``melra_plan``'s input: exactly the seed's eight fields."""

    goal: Annotated[str, StringConstraints(min_length=1, max_length=10_000)]
    operation: Operation
    budget: Budget = Budget()
    identity: Identity | None = None
    constraints: tuple[Annotated[str, StringConstraints(max_length=10_000)], ...] = Field(
        default=(), max_length=50
    )
    reconciliation: tuple[EvidencePredicate, ...] = Field(default=(), max_length=5)
    forbidden_effects: tuple[Effect, ...] = ()
    required_evidence: tuple[EvidencePredicate, ...] = Field(default=(), max_length=20)

    def operation_json(self) -> dict[str, Any]:
        """The operation as the challenge digests it (absent optionals dropped)."""
        value: dict[str, Any] = self.operation.model_dump(mode="json", by_alias=True, exclude_none=True)
        return value


def task_id_for(operation_id: str) -> str:
    """The task of the ``melra_plan`` call ``operation_id`` (the same on every re-run)."""
    return str(uuid.uuid5(TASK_NAMESPACE, operation_id))


def approval_id_for(task_id: str) -> str:
    return str(uuid.uuid5(TASK_NAMESPACE, f"{task_id}:approval"))


def parse_request(args: Any, session_identity: Identity) -> TaskRequest:
    """Validate ``melra_plan``'s arguments.

    Raises:
        MakaError: a ``RequestRefusal``: ``operation_kind_not_supported`` (a kind other than
            file/terminal), ``task_request_invalid`` (with the field),
            ``operation_action_not_supported``, ``identity_not_session_principal``.
    """
    operation = args.get("operation") if isinstance(args, dict) else None
    kind = operation.get("kind") if isinstance(operation, dict) else None
    if isinstance(kind, str) and kind not in ("file", "terminal"):
        raise MakaError(
            "operation_kind_not_supported",
            f"operation kind {kind!r} is not run here; only 'file' and 'terminal' operations are",
            kind=kind,
        )
    try:
        # Strict, through JSON (as a policy file is): "1" is not a number, true is not 1.
        request = TaskRequest.model_validate_json(canonical_json.dumps(args), strict=True, by_alias=True)
    except (ValidationError, CodecError) as exc:
        if isinstance(exc, CodecError):
            raise MakaError("task_request_invalid", exc.message, field="$") from None
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "$"
        raise MakaError("task_request_invalid", f"{where}: {first['msg']}", field=where) from None
    if request.identity is not None and request.identity.principal != session_identity.principal:
        raise MakaError(
            "identity_not_session_principal",
            f"the session acts as {session_identity.principal.ref}, not {request.identity.principal.ref}",
        )
    inner_call(request)  # refuses what no tool here can perform
    return request


def inner_call(request: TaskRequest) -> tuple[str, dict[str, Any]]:
    """The tool and arguments that perform the planned operation.

    Raises:
        MakaError: ``operation_action_not_supported`` naming the action or field.
    """
    op = request.operation

    def unsupported(what: str) -> MakaError:
        return MakaError(
            "operation_action_not_supported",
            f"{what} is not run here; runnable: {', '.join(sorted(RUNNABLE))}",
            action=f"{op.kind}.{op.action}",
        )

    if isinstance(op, FileOperation):
        if f"file.{op.action}" not in RUNNABLE:
            raise unsupported(f"file action {op.action!r}")
        if op.destination is not None or op.recursive:
            raise unsupported("a destination or recursive flag on this file action")
        if op.action == "write":
            if op.content is None:
                raise MakaError("task_request_invalid", "operation.content: a write needs content")
            if op.encoding != "utf8":
                raise unsupported("base64 content")
            return "write_file", {"path": op.path, "content": op.content}
        if op.content is not None:
            raise unsupported("content on a read")
        return ("read_file" if op.action == "read" else "list_dir"), {"path": op.path}
    if op.action != "run":
        raise unsupported(f"terminal action {op.action!r}")
    if op.command is None:
        raise MakaError("task_request_invalid", "operation.command: a run needs a command")
    if op.job_id or op.cwd or op.env or op.interactive or op.input is not None:
        raise unsupported("jobId, cwd, env, interactive or input on a terminal run")
    # Shell-free as MELRA's: every word quoted, so the line is exactly one command and its args.
    return "bash", {"command": shlex.join([op.command, *op.args])}


class TaskPlan(GovernanceModel):
    """What ``melra_plan`` decided: the status, why, and the challenge when approval is needed."""

    task_id: str
    status: PlanStatus
    reason: str
    classification: Classification
    execution_guarantee: ExecutionGuarantee
    required_evidence: tuple[EvidencePredicate, ...]
    policy_version: str
    policy_digest: str
    challenge: ApprovalChallenge | None = None


def task_identity(request: TaskRequest, session: Identity) -> Identity:
    return request.identity or session


def decide_task(
    policy: GovernancePolicy,
    request: TaskRequest,
    *,
    session_identity: Identity,
    worker_forbidden: frozenset[Effect],
    now: datetime,
    lookup: ProgramLookup | None = None,
) -> PolicyDecision:
    """MELRA's decision for the task (default evidence applied first, as its controller does);
    ``lookup``: where the sandbox finds a terminal command's program (``classify_operation``)."""
    classification = classify_operation(request.operation_json(), lookup)
    call = governed_call(
        policy,
        classification,
        request.operation_json(),
        identity=task_identity(request, session_identity),
        constraints=request.constraints,
        forbidden_effects=tuple(frozenset(request.forbidden_effects) | worker_forbidden),
        required_evidence=request.required_evidence,
    )
    return decide(policy, call, now=now)


def plan_task(
    policy: GovernancePolicy,
    request: TaskRequest,
    *,
    task_id: str,
    session_identity: Identity,
    worker_forbidden: frozenset[Effect] = frozenset(),
    now: datetime,
    lookup: ProgramLookup | None = None,
) -> TaskPlan:
    """Plan without executing: the decision, and for ``confirm`` the task's scoped challenge."""
    decision = decide_task(
        policy,
        request,
        session_identity=session_identity,
        worker_forbidden=worker_forbidden,
        now=now,
        lookup=lookup,
    )
    c = decision.classification
    status: PlanStatus = {"allow": "planned", "deny": "policy_blocked", "confirm": "awaiting_approval"}[
        decision.outcome  # type: ignore[assignment]
    ]
    challenge = None
    if status == "awaiting_approval":
        challenge = issue_challenge(
            task_id,
            request.operation_json(),
            now=now,
            ttl_ms=policy.approval_ttl_ms,
            approval_id=approval_id_for(task_id),
        )
    return TaskPlan(
        task_id=task_id,
        status=status,
        reason=decision.reason,
        classification=c,
        execution_guarantee=task_guarantee(
            c, policy.trusted_reads, declares_reconciliation=bool(request.reconciliation)
        ),
        required_evidence=decision.required_evidence,
        policy_version=decision.policy_version,
        policy_digest=decision.policy_digest,
        challenge=challenge,
    )


# --- the task controller --------------------------------------------------------------------


@dataclass(frozen=True)
class Execution:
    """One ``melra_execute`` of a task as the ledger holds it: its decision and its receipt."""

    operation_id: str
    waiting: bool  # its approval request is still unanswered
    receipt_status: TaskStatus | None  # None: no outcome committed (yet)
    parked: bool = False  # recovery parked it after T1: an operator settles it, never a retry


def task_status(plan_status: PlanStatus, executions: Sequence[Execution]) -> TaskStatus:
    """The task's status: the plan's until an execution decides, then the latest execution's."""
    if not executions:
        return plan_status
    last = executions[-1]
    if last.receipt_status is not None:
        return last.receipt_status
    if last.parked:
        return "recovery_required"
    return "awaiting_approval" if last.waiting else "running"


_NEVER_AGAIN: frozenset[TaskStatus] = frozenset(
    {"running", "verified_success", "partial", "recovery_required"}
)


def execute_refusal(
    budget: Budget,
    *,
    is_read: bool,
    plan_status: PlanStatus,
    prior: Sequence[Execution],
    planned_at_ms: int,
    now_ms: int,
) -> TaskError | None:
    """Why this execution may not run, from the executions before it (None: it may).

    ``duplicate_attempt_prevented``: an attempt has no outcome yet or already settled the task,
    or a mutation already failed (only reads are retried). ``task_budget_exhausted``:
    ``maxSteps`` executions were made, ``maxDurationMs`` passed since the plan, or a read has
    failed more than ``maxRetries`` times.
    """
    status = task_status(plan_status, prior)
    if status in _NEVER_AGAIN or (status == "failed" and not is_read):
        return "duplicate_attempt_prevented"
    if status == "budget_exhausted" or len(prior) >= budget.max_steps:
        return "task_budget_exhausted"
    if now_ms - planned_at_ms > budget.max_duration_ms:
        return "task_budget_exhausted"
    failed = sum(1 for e in prior if e.receipt_status == "failed")
    if is_read and failed > budget.max_retries:
        return "task_budget_exhausted"
    return None


def plan_view(plan: TaskPlan, request: TaskRequest) -> dict[str, Any]:
    """``melra_plan``'s result."""
    value: dict[str, Any] = {
        "taskId": plan.task_id,
        "status": plan.status,
        "reason": plan.reason,
        "goal": request.goal,
        "capability": plan.classification.capability,
        "effect": plan.classification.effect,
        "risk": plan.classification.risk,
        "target": plan.classification.target,
        "executionGuarantee": plan.execution_guarantee,
        "requiredEvidence": [p.model_dump(mode="json", by_alias=True) for p in plan.required_evidence],
        "budget": request.budget.model_dump(mode="json", by_alias=True),
        "policyVersion": plan.policy_version,
    }
    if plan.challenge is not None:
        value["challenge"] = plan.challenge.model_dump(mode="json", by_alias=True)
    return value


def executions_from(rows: Sequence[Mapping[str, Any]]) -> list[Execution]:
    """From ``melra_executions`` rows (``{operationId, state, receipt}``), oldest first."""
    out = []
    for row in rows:
        receipt = row.get("receipt")
        status = receipt.get("observedEffect", {}).get("status") if isinstance(receipt, Mapping) else None
        waiting = row.get("state") == "awaiting_approval"
        out.append(Execution(str(row["operationId"]), waiting, status, parked=bool(row.get("parked"))))
    return out
