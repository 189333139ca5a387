"""What every MELRA tool shares: the binding of one call (``MelraContext``: the ledger's task rows,
the session's terms, the sibling tools, the clock), the subject policy judges for ``melra_execute``
(``TaskSubject``), and the unbound and bound tool bases. The tools themselves are in ``tools.melra``
(plan, execute) and ``tools.melra_reads`` (task status, receipt).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from maka_core.errors import MakaError
from maka_core.facts.events import RecoveryMode
from maka_core.governance.challenge import ApprovalChallenge
from maka_core.governance.classify import Classification
from maka_core.governance.evidence import EvidencePredicate
from maka_core.governance.policy_file import GovernancePolicy, Identity
from maka_core.tools.base import Effect, FileEvidence, Heartbeat, Reconciliation, Tool, ToolResult

if TYPE_CHECKING:
    from maka_core.workspace import Workspace


class TaskStore(Protocol):
    """What the MELRA tools read and write in the ledger."""

    def put_melra_task(
        self,
        task_id: str,
        *,
        session_id: str,
        plan_operation_id: str,
        request: Mapping[str, Any],
        plan: Mapping[str, Any],
        planned_at: int,
    ) -> dict[str, Any]: ...

    def melra_task(self, task_id: str) -> dict[str, Any] | None: ...

    def melra_executions(self, session_id: str, task_id: str) -> list[dict[str, Any]]: ...

    def receipts(self, session_id: str) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class MelraContext:
    """One call's binding: the ledger, the session's terms, the sibling tools and the clock."""

    store: TaskStore
    session_id: str
    operation_id: str
    policy: GovernancePolicy
    identity: Identity
    worker_forbidden: frozenset[Effect]
    #: The worker's own switches for a sibling tool call (None: clear), as ``Policy.evaluate``.
    worker_check: Callable[[Tool, dict[str, Any]], ToolResult | None]
    #: The sibling tools a task may run: only those the session offers.
    tools: Mapping[str, Tool]
    now: datetime
    now_ms: int
    #: The names the session offers (``tools.offer``); ``None``: every tool.
    offered: frozenset[str] | None = None

    def not_offered(self, inner_name: str) -> ToolResult | None:
        """``tool_not_offered`` when a task's operation runs a tool the session does not offer."""
        if self.offered is None or inner_name in self.offered:
            return None
        return ToolResult.error(
            "tool_not_offered",
            f"this task runs {inner_name!r}, which is not offered in this session",
            tool=inner_name,
        )


@dataclass(frozen=True)
class TaskSubject:
    """What policy judges for ``melra_execute``: the planned task, not the tool."""

    task_id: str
    classification: Classification
    identity: Identity
    constraints: tuple[str, ...]
    forbidden_effects: frozenset[Effect]
    required_evidence: tuple[EvidencePredicate, ...]
    operation: dict[str, Any]
    declares_reconciliation: bool
    challenge: ApprovalChallenge | None
    #: ``(approvalId, phrase)`` given in the call's ``approval`` argument.
    approval: tuple[str, str] | None
    exhausted: bool


def error_result(exc: MakaError) -> ToolResult:
    return ToolResult.error(exc.code, exc.message, **exc.detail)


class MelraTool:
    """An unbound MELRA tool: it describes itself, and refuses to run until bound."""

    #: The runtime binds it to its call's session (``runtime.melra.bind``: the ledger, the
    #: session's terms, the sibling tools) before preflight.
    binds_to_session: ClassVar[bool] = True
    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]
    recovery_mode: ClassVar[RecoveryMode] = "replay_safe"
    mutates: ClassVar[bool] = False
    effects: ClassVar[frozenset[str]] = frozenset({"read"})

    def preflight(self, args: dict[str, Any], ws: Workspace) -> ToolResult | None:
        return ToolResult.error("melra_unbound", f"{self.name} runs only on the tool path")

    def capture_evidence(self, args: dict[str, Any], ws: Workspace) -> FileEvidence | None:
        return None

    def run(self, args: dict[str, Any], ws: Workspace, heartbeat: Heartbeat) -> ToolResult:
        return ToolResult.error("melra_unbound", f"{self.name} runs only on the tool path")

    def reconcile(
        self, args: dict[str, Any], ws: Workspace, evidence: FileEvidence | None
    ) -> Reconciliation | None:
        return None

    def bind(self, ctx: MelraContext) -> Tool:
        raise NotImplementedError


def check_keys(args: dict[str, Any], allowed: set[str], required: set[str], tool: str) -> None:
    extra = sorted(set(args) - allowed)
    missing = sorted(required - set(args))
    if extra or missing:
        raise MakaError(
            "invalid_args", f"{tool} takes {sorted(allowed)}; unexpected {extra}, missing {missing}"
        )
    for key in args:
        if key != "approval" and not isinstance(args[key], str):
            raise MakaError("invalid_args", f"{tool}: {key} must be a string")


def task_of(ctx: MelraContext, task_id: Any) -> dict[str, Any]:
    task = ctx.store.melra_task(task_id) if isinstance(task_id, str) else None
    if task is None or task["sessionId"] != ctx.session_id:
        raise MakaError("task_not_found", f"this session has no task {task_id}", taskId=task_id)
    return task


class BoundMelraTool(MelraTool):
    def __init__(self, ctx: MelraContext) -> None:
        self.ctx = ctx
