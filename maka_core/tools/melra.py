"""The MELRA tool family: ``melra_plan``, ``melra_execute``, ``melra_task_status``, ``melra_receipt``.

They are ordinary tools in the registry and pass through the one tool path (guard, preflight,
policy, T1, effect, evidence, T2, receipt). What they need beyond a workspace (the ledger's task
rows, the session's policy and principal, the sibling tools, the runtime's clock) reaches them by
``bind``: the tool path binds each call (``runtime.melra.bind``) before preflight, and recovery
binds a read it re-runs. An unbound instance only describes itself to providers.

- ``melra_plan`` is a read as far as the session's policy is concerned (the seed's annotation):
  its only effect is the task row, written insert-if-absent under the task id derived from the
  call's operation id, so its guarantee is ``read-only``: after a crash between the row and T2,
  recovery runs it again and the re-run returns the stored plan, never a second task.
- ``melra_execute`` is judged by the *task*: the bound tool carries a ``TaskSubject`` (the
  planned operation's classification, identity, constraints, forbidden effects and evidence),
  so MELRA's decision re-runs in full on the tool path (capability and policy again; the
  constraints step becomes reachable here). The planned operation runs through the existing
  file or shell tool, its receipt commits with T2 tagged with the task id, and its guarantee is
  the task's: a read may run again after a crash, a mutation is at-most-once (parked).
- ``melra_task_status`` and ``melra_receipt`` are reads over the ledger (``tools.melra_reads``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from maka_core.errors import MakaError
from maka_core.facts.events import RecoveryMode
from maka_core.governance.challenge import ApprovalChallenge
from maka_core.governance.classify import classify_operation
from maka_core.governance.evidence import EvidenceItem, TaskStatus
from maka_core.governance.guarantee import task_guarantee
from maka_core.governance.receipts import receipt_id_for
from maka_core.governance.tasks import (
    TaskError,
    TaskRequest,
    TerminalOperation,
    execute_refusal,
    executions_from,
    inner_call,
    parse_request,
    plan_task,
    plan_view,
    task_id_for,
    task_identity,
    task_status,
)
from maka_core.tools import names
from maka_core.tools.base import Heartbeat, Tool, ToolResult
from maka_core.tools.melra_base import (
    BoundMelraTool,
    MelraContext,
    MelraTool,
    TaskSubject,
    check_keys,
    error_result,
    task_of,
)
from maka_core.tools.melra_reads import MelraReceiptTool, MelraTaskStatusTool
from maka_core.tools.shell import BashTool

if TYPE_CHECKING:
    from maka_core.workspace import Workspace

SEED_DESCRIPTIONS = {
    "goal": "Why this task is being run, in one human-readable sentence.",
    "budget": "maxSteps (executions), maxDurationMs (from planning), maxRetries (reads only).",
    "identity": (
        "Who is asking, and on whose behalf. Recorded on the task and every receipt, and matched against "
        "policy.capabilities when the operator has issued grants. Omitted means the implicit local principal."
    ),
    "operation": "The one operation: kind 'file' (read, list, write) or 'terminal' (run).",
    "constraints": (
        "Leave empty. Freeform prose cannot be enforced, so a non-empty array is denied with "
        "freeform_constraints_not_enforceable. Express real limits as forbiddenEffects, budget, or "
        "requiredEvidence."
    ),
    "reconciliation": (
        "How to settle this effect if MELRA never learns whether it happened. Declaring these makes the "
        "executionGuarantee reconciliation-required instead of at-most-once."
    ),
    "forbiddenEffects": (
        "Effects this task must never take. Denied before the adapter runs, and honoured even in "
        "unhinged mode."
    ),
    "requiredEvidence": (
        "Predicates that must hold after execution for the task to be verified_success. Required for any "
        "non-read operation: a mutation with none is denied with mutation_requires_evidence. An adapter that "
        "succeeded while a predicate failed is partial, never success."
    ),
}
_SEED_ORDER = tuple(SEED_DESCRIPTIONS)


def _untitled(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _untitled(v) for k, v in value.items() if k != "title"}
    if isinstance(value, list):
        return [_untitled(v) for v in value]
    return value


def plan_parameters() -> dict[str, Any]:
    """``melra_plan``'s JSON schema: the seed's fields in the seed's order, with its descriptions."""
    schema: dict[str, Any] = _untitled(TaskRequest.model_json_schema(by_alias=True))
    props = schema["properties"]
    schema["properties"] = {k: {**props[k], "description": SEED_DESCRIPTIONS[k]} for k in _SEED_ORDER}
    schema.pop("description", None)
    return schema


class MelraPlanTool(MelraTool):
    name: ClassVar[str] = names.MELRA_PLAN
    description: ClassVar[str] = (
        "Persist a bounded task, evaluate policy, and return any scoped approval challenge without "
        "executing. Nothing runs until melra_execute. A policy denial comes back as a normal result with "
        "status policy_blocked and a reason, not as an error. Any operation that is not a read needs "
        "requiredEvidence, and constraints must stay empty."
    )
    parameters: ClassVar[dict[str, Any]] = plan_parameters()

    def bind(self, ctx: MelraContext) -> Tool:
        return _BoundPlan(ctx)


class MelraExecuteTool(MelraTool):
    name: ClassVar[str] = names.MELRA_EXECUTE
    description: ClassVar[str] = (
        "Run one planned MELRA task through policy (evaluated again), the runtime, verification and "
        "receipts. For a task awaiting approval pass approval {approvalId, phrase} from its challenge, "
        "or wait for the operator to approve. Only reads are retried."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "taskId": {"type": "string", "format": "uuid"},
            "approval": {
                "type": "object",
                "properties": {
                    "approvalId": {"type": "string", "format": "uuid"},
                    "phrase": {"type": "string"},
                },
                "required": ["approvalId", "phrase"],
                "additionalProperties": False,
            },
        },
        "required": ["taskId"],
        "additionalProperties": False,
    }
    # Unbound it may do anything a task may; bound, it has exactly its task's effect.
    mutates: ClassVar[bool] = True
    effects: ClassVar[frozenset[str]] = frozenset({"read", "mutate", "destructive"})
    recovery_mode: ClassVar[RecoveryMode] = "never_auto_retry"

    def bind(self, ctx: MelraContext) -> Tool:
        return BoundExecute(ctx)


def melra_tools() -> list[Tool]:
    """The four MELRA tools, unbound (as the registry offers them to providers)."""
    return [MelraPlanTool(), MelraExecuteTool(), MelraTaskStatusTool(), MelraReceiptTool()]


# --- bound --------------------------------------------------------------------------------------


def _stored_request(task: Mapping[str, Any]) -> TaskRequest:
    return TaskRequest.model_validate(task["request"], by_alias=True)


class _BoundPlan(BoundMelraTool, MelraPlanTool):
    def preflight(self, args: dict[str, Any], ws: Workspace) -> ToolResult | None:
        try:
            request = parse_request(args, self.ctx.identity)
        except MakaError as exc:
            return error_result(exc)
        # Refused before T1, so no task is stored that could only ever be refused at execute.
        return self.ctx.not_offered(inner_call(request)[0])

    def run(self, args: dict[str, Any], ws: Workspace, heartbeat: Heartbeat) -> ToolResult:
        ctx = self.ctx
        task_id = task_id_for(ctx.operation_id)
        stored = ctx.store.melra_task(task_id)
        if stored is None:
            request = parse_request(args, ctx.identity)
            refused = ctx.not_offered(inner_call(request)[0])
            if refused is not None:
                return refused
            bash = ctx.tools.get("bash")
            plan = plan_task(
                ctx.policy,
                request,
                task_id=task_id,
                session_identity=ctx.identity,
                worker_forbidden=ctx.worker_forbidden,
                now=ctx.now,
                lookup=bash.search_path().locate if isinstance(bash, BashTool) else None,
            )
            stored = ctx.store.put_melra_task(
                task_id,
                session_id=ctx.session_id,
                plan_operation_id=ctx.operation_id,
                request=request.model_dump(mode="json", by_alias=True, exclude_none=True),
                plan=plan_view(plan, request),
                planned_at=ctx.now_ms,
            )
        return ToolResult.json(copy.deepcopy(stored["plan"]))


class BoundExecute(BoundMelraTool, MelraExecuteTool):
    """``melra_execute`` bound to its task (see the module docstring)."""

    def __init__(self, ctx: MelraContext) -> None:
        super().__init__(ctx)
        self.problem: ToolResult | None = None
        self.subject: TaskSubject | None = None
        self.inner: Tool | None = None
        self.inner_args: dict[str, Any] = {}

    def _load(self, args: dict[str, Any]) -> None:
        ctx = self.ctx
        try:
            check_keys(args, {"taskId", "approval"}, {"taskId"}, self.name)
            approval = args.get("approval")
            given: tuple[str, str] | None = None
            if approval is not None:
                if (
                    not isinstance(approval, dict)
                    or set(approval) != {"approvalId", "phrase"}
                    or not all(isinstance(v, str) for v in approval.values())
                ):
                    raise MakaError("invalid_args", "approval is exactly {approvalId, phrase}, both strings")
                given = (approval["approvalId"], approval["phrase"])
            task = task_of(ctx, args["taskId"])
            request = _stored_request(task)
            inner_name, self.inner_args = inner_call(request)
        except MakaError as exc:
            self.problem = error_result(exc)
            return
        # Planning refuses such a task already; a task planned under a wider set is refused here.
        self.problem = ctx.not_offered(inner_name)
        if self.problem is not None:
            return
        self.inner = ctx.tools.get(inner_name)
        if self.inner is None:
            self.problem = ToolResult.error(
                "tool_not_found", f"no tool named {inner_name!r} performs this task"
            )
            return
        op = request.operation
        if isinstance(op, TerminalOperation) and isinstance(self.inner, BashTool):
            # The task's own limits, never looser than the worker's (MELRA's timeoutMs/maxOutputChars).
            limits = {"timeout_ms": op.timeout_ms, "max_output_chars": op.max_output_chars}
            self.inner = self.inner.with_limits(**limits)
        plan = task["plan"]
        # A terminal command is judged by the program the bash tool's sandbox would run for it.
        lookup = self.inner.search_path().locate if isinstance(self.inner, BashTool) else None
        classification = classify_operation(request.operation_json(), lookup)
        prior = executions_from(
            [
                e
                for e in ctx.store.melra_executions(ctx.session_id, task["taskId"])
                if e["operationId"] != ctx.operation_id
            ]
        )
        refusal: TaskError | None = execute_refusal(
            request.budget,
            is_read=classification.is_read,
            plan_status=plan["status"],
            prior=prior,
            planned_at_ms=task["plannedAt"],
            now_ms=ctx.now_ms,
        )
        if refusal == "duplicate_attempt_prevented":
            status = task_status(plan["status"], prior)
            self.problem = ToolResult.error(
                refusal,
                f"task {task['taskId']} is {status}: it is not run again",
                taskId=task["taskId"],
                status=status,
            )
            return
        challenge = plan.get("challenge")
        self.subject = TaskSubject(
            task_id=task["taskId"],
            classification=classification,
            identity=task_identity(request, ctx.identity),
            constraints=request.constraints,
            forbidden_effects=frozenset(request.forbidden_effects),
            required_evidence=request.required_evidence,
            operation=request.operation_json(),
            declares_reconciliation=bool(request.reconciliation),
            challenge=None if challenge is None else ApprovalChallenge.model_validate(challenge),
            approval=given,
            exhausted=refusal == "task_budget_exhausted",
        )

    @property
    def effects(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({self.subject.classification.effect}) if self.subject else MelraExecuteTool.effects

    @property
    def recovery_mode(self) -> RecoveryMode:  # type: ignore[override]
        # A read task may be read again after a crash (a terminal command only where the session's
        # policy trusts it); a mutation whose plan declared reconciliation predicates is settled
        # from them (``runtime.melra.reconcile_task``); any other mutation is at-most-once (it parks).
        subject = self.subject
        if subject is None:
            return "never_auto_retry"
        guarantee = task_guarantee(
            subject.classification,
            self.ctx.policy.trusted_reads,
            declares_reconciliation=subject.declares_reconciliation,
        )
        modes: dict[str, RecoveryMode] = {"read-only": "replay_safe", "reconciliation-required": "reconcile"}
        return modes.get(guarantee, "never_auto_retry")

    def preflight(self, args: dict[str, Any], ws: Workspace) -> ToolResult | None:
        self._load(args)
        if self.problem is not None:
            return self.problem
        assert self.inner is not None
        blocked = self.ctx.worker_check(self.inner, self.inner_args)
        return blocked if blocked is not None else self.inner.preflight(self.inner_args, ws)

    def run(self, args: dict[str, Any], ws: Workspace, heartbeat: Heartbeat) -> ToolResult:
        if self.inner is None:
            self._load(args)
        if self.inner is None:
            return self.problem or ToolResult.error("task_not_found", "no task to run")
        return self.inner.run(self.inner_args, ws, heartbeat)

    def present(self, result: ToolResult, status: TaskStatus, items: tuple[EvidenceItem, ...]) -> ToolResult:
        """What the model sees: the task's status, evidence and receipt beside the tool's result."""
        task_id = self.subject.task_id if self.subject else None
        return execution_view(task_id, self.ctx.operation_id, result, status, items)


def execution_view(
    task_id: str | None,
    operation_id: str,
    result: ToolResult,
    status: TaskStatus,
    items: tuple[EvidenceItem, ...],
) -> ToolResult:
    """``melra_execute``'s answer: the task's status, evidence and receipt beside the tool's result."""
    raw = result.result if isinstance(result.result, dict) else {}
    value = raw.get("value") if raw.get("kind") == "json" else raw.get("text")
    return ToolResult.json(
        {
            "taskId": task_id,
            "status": status,
            "receiptId": receipt_id_for(operation_id),
            "evidence": [{"type": i.type, "passed": i.passed, "summary": i.summary} for i in items],
            "result": value,
        },
        is_error=result.is_error,
    )
