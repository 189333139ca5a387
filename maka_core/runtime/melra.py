"""Binding a MELRA tool to its call: the ledger, the session's terms, the sibling tools, the clock;
and settling an interrupted task from its declared reconciliation predicates.

The tool path calls ``bind`` right after looking a tool up (``tool_admission.admit_call``, on the ledger
thread, before preflight), and recovery calls it before re-running a read, so the same call sees
the same task store and session terms however it is run. Every other tool passes through as is.

``reconcile_task`` is what recovery observes for a ``melra_execute`` dispatched without an outcome
whose task declared ``reconciliation``: the predicates are evaluated by the evidence path's own
evaluator against the workspace now (and ``result_*`` against the pre-call facts, the planned
operation, as MELRA evaluates them). All hold: the effect is known to have happened
(``matches_expected_state``); one that could not be observed (a probe error, an exit code nobody
saw): ``unreadable``; otherwise ``diverged``. The effect is never run again.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from maka_core.errors import MakaError
from maka_core.facts import canonical_json
from maka_core.facts.clock import now_ms
from maka_core.facts.codec import digest
from maka_core.facts.events import Observation
from maka_core.governance import ProbedFile, ToolObservation, evaluate
from maka_core.governance.evidence import STATE_PREDICATES
from maka_core.governance.tasks import TaskRequest
from maka_core.runtime.verification import probe_in
from maka_core.tools import Tool, ToolResult
from maka_core.tools.base import Reconciliation
from maka_core.tools.melra_base import MelraContext

if TYPE_CHECKING:
    from maka_core.runtime.runtime import Runtime
    from maka_core.workspace import Workspace


def bind(
    rt: Runtime, tool: Tool, session_id: str, operation_id: str, offered: frozenset[str] | None = None
) -> Tool:
    """``tool`` bound to this call when it is a MELRA tool; otherwise ``tool`` itself.

    ``offered`` is what the session offers (``Runtime.offered``; ``None``: every tool): a task
    reaches only those tools, so a set that leaves ``bash`` out leaves it out of MELRA too.
    """
    if not getattr(tool, "binds_to_session", False):
        return tool
    gov = rt.session_governance(session_id)

    def worker_check(inner: Tool, args: dict[str, Any]) -> ToolResult | None:
        limits = rt.policy.evaluate(inner, args)
        return None if limits.allowed else limits.to_result()

    # One reading of the runtime's clock per call: the plan's time and every budget check use it.
    ms = now_ms()
    ctx = MelraContext(
        store=rt.ledger,
        session_id=session_id,
        operation_id=operation_id,
        policy=gov.policy,
        identity=gov.identity,
        worker_forbidden=rt.policy.forbidden_effects,
        worker_check=worker_check,
        tools=rt.tools if offered is None else {n: t for n, t in rt.tools.items() if n in offered},
        offered=offered,
        now=datetime.fromtimestamp(ms / 1000, tz=UTC),
        now_ms=ms,
    )
    bound: Tool = tool.bind(ctx)  # type: ignore[attr-defined]
    return bound


def reconcile_task(task: Mapping[str, Any], ws: Workspace) -> Reconciliation:
    """Observe an interrupted task's effect through its declared reconciliation predicates."""
    request = TaskRequest.model_validate(task["request"], by_alias=True)
    predicates = request.reconciliation
    probe = probe_in(ws, hashes=any(p.type == "file_hash" for p in predicates))
    unobserved: set[str] = set()

    def observing(path: str) -> ProbedFile:
        try:
            return probe(path)  # type: ignore[no-any-return]
        except MakaError:
            unobserved.add(path)
            raise

    items = evaluate(predicates, ToolObservation(result=request.operation_json()), observing)
    failed = [p for p, i in zip(predicates, items, strict=True) if not i.passed]
    # Nobody saw an exit code, and a probe that raised saw nothing: not knowing is not diverging.
    blind = [
        p
        for p in failed
        if p.type == "exit_code" or (p.type in STATE_PREDICATES and getattr(p, "path", None) in unobserved)
    ]
    observation: Observation = "unreadable" if blind else "diverged" if failed else "matches_expected_state"
    observed = {
        "taskId": task["taskId"],
        "reconciliation": [i.model_dump(mode="json", by_alias=True, exclude_none=True) for i in items],
    }
    recovered = None
    if observation == "matches_expected_state":
        recovered = ToolResult.json({"reconciled": True, **observed})
    return Reconciliation(
        observation=observation,
        observation_digest=digest(canonical_json.dumps(observed)),
        recovered=recovered,
        observed=observed,
    )
