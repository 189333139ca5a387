"""What may be done with an action more than once: MELRA's execution guarantee and restart rules.

The guarantee is derived from the classified effect and the tool's own declared reconciliation,
never from the caller: a caller that could call its own write retry-safe would buy a retry it
is not entitled to. A tool that declares ``never_auto_retry`` (``bash``) keeps ``at-most-once``
whatever its classification says: a parse of a command line is not evidence enough to run it
twice. Only a call the session's policy trusts (``trustedReadCommands``, ``trusted_read``) is
``read-only``. A contract tool declares its own (``tools.contract.ToolGuarantee``). Only
``read-only``, ``at-least-once`` and ``provider-idempotent`` allow a retry, the last two with the
call's one idempotency key.

After a restart: planned and approval-waiting work stays executable; an interrupted read goes
back to planned and may run again; a mutation interrupted while verifying may still be settled,
but only when every predicate re-reads the filesystem; any other interrupted mutation is
``recovery_required`` and never re-run automatically.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from maka_core.facts.events import RecoveryMode
from maka_core.governance.classify import Classification
from maka_core.governance.commands import TRUSTABLE_READ_COMMANDS
from maka_core.governance.evidence import STATE_PREDICATES, EvidencePredicate, TaskStatus
from maka_core.tools.base import Effect
from maka_core.tools.contract import GUARANTEE_LATITUDE, ToolGuarantee

#: A tool declares one of ``ToolGuarantee``; MELRA also names ``compensatable`` (nothing here
#: derives it).
ExecutionGuarantee = Literal[ToolGuarantee, "compensatable"]
RestartAction = Literal["keep", "retry", "verify", "recovery_required", "settled"]
OUTCOME_UNKNOWN_PREFIX = "effect_outcome_unknown:"

_RETRIABLE: frozenset[ExecutionGuarantee] = frozenset({"read-only", "at-least-once", "provider-idempotent"})
_SETTLED: frozenset[TaskStatus] = frozenset(
    {
        "verified_success",
        "partial",
        "failed",
        "cancelled",
        "policy_blocked",
        "budget_exhausted",
        "recovery_required",
    }
)


def derive_guarantee(effect: Effect, *, declares_reconciliation: bool) -> ExecutionGuarantee:
    """``read-only`` for a read; ``reconciliation-required`` for a mutation whose tool declares a
    reconciler (or whose plan declared reconciliation predicates); ``at-most-once`` otherwise."""
    if effect == "read":
        return "read-only"
    return "reconciliation-required" if declares_reconciliation else "at-most-once"


def trusted_read(classification: Classification, trusted: frozenset[str]) -> bool:
    """A command line the classifier proved to be only reads, every one named in ``trusted`` (and
    trustable at all: a policy cannot name another, and neither can a caller here)."""
    return (
        classification.unanalysable is None
        and classification.possible_effects == {"read"}
        and bool(classification.commands)
        and all(n in trusted and n in TRUSTABLE_READ_COMMANDS for n in classification.commands or ())
    )


def task_guarantee(
    classification: Classification, trusted: frozenset[str], *, declares_reconciliation: bool
) -> ExecutionGuarantee:
    """A planned task's guarantee: ``read-only`` for a read, except a terminal command, which is a
    parse of a command as ``bash``'s line is: ``read-only`` only where the session's policy trusts it
    (``trusted_read``), else judged as the mutation it may be (``reconciliation-required`` with
    declared predicates, ``at-most-once`` without)."""
    read = classification.possible_effects == {"read"} and (
        classification.kind != "terminal" or trusted_read(classification, trusted)
    )
    return derive_guarantee("read" if read else "mutate", declares_reconciliation=declares_reconciliation)


def guarantee_for_tool(
    effect: Effect, recovery_mode: RecoveryMode, *, trusted: bool = False
) -> ExecutionGuarantee:
    """The guarantee of one classified call of a tool with ``recovery_mode``; a
    ``never_auto_retry`` tool's read is ``read-only`` only when ``trusted`` (``trusted_read``)."""
    if recovery_mode == "never_auto_retry":
        return "read-only" if effect == "read" and trusted else "at-most-once"
    return derive_guarantee(effect, declares_reconciliation=recovery_mode == "reconcile")


def narrowed(declared: ExecutionGuarantee, asked: str | None) -> ExecutionGuarantee:
    """``declared`` as a policy's ``toolGuarantees`` entry ``asked`` narrows it: ``at-most-once``
    always (park rather than re-run); another guarantee permitting fewer re-runs; never a wider
    one, and never ``reconciliation-required`` (only a tool that reconciles may promise it)."""
    if asked is None or asked == declared:
        return declared
    if asked == "at-most-once":
        return "at-most-once"
    if asked == "reconciliation-required" or asked not in GUARANTEE_LATITUDE:
        return declared
    wider = GUARANTEE_LATITUDE.get(declared, 0)  # compensatable: never re-run
    return asked if GUARANTEE_LATITUDE[asked] < wider else declared  # type: ignore[return-value]


def within(recorded: ExecutionGuarantee, ceiling: ExecutionGuarantee) -> ExecutionGuarantee:
    """``recorded`` held to ``ceiling``, what may be trusted now: ``at-most-once`` if either is; the
    one permitting fewer re-runs otherwise (``recorded`` when they permit as many)."""
    if "at-most-once" in (recorded, ceiling):
        return "at-most-once"
    if GUARANTEE_LATITUDE.get(ceiling, 0) < GUARANTEE_LATITUDE.get(recorded, 0):
        return ceiling
    return recorded


def allows_retry(guarantee: ExecutionGuarantee) -> bool:
    """Whether a second attempt is ever permitted under ``guarantee``."""
    return guarantee in _RETRIABLE


def retry_allowed(guarantee: ExecutionGuarantee, *, retries_used: int, max_retries: int) -> bool:
    """Whether one more attempt may run: a retriable guarantee with budget left (MELRA's
    ``budget.maxRetries`` counts for reads only; a mutation's is ignored, not honoured)."""
    return allows_retry(guarantee) and retries_used < max_retries


def is_outcome_unknown(error: str | None) -> bool:
    """An error saying the request went out and no answer came back: park, never report failed."""
    return error is not None and error.startswith(OUTCOME_UNKNOWN_PREFIX)


def restart_action(
    guarantee: ExecutionGuarantee, status: TaskStatus, predicates: Sequence[EvidencePredicate]
) -> RestartAction:
    """What recovery does with a task found in ``status`` after a restart."""
    if status in _SETTLED:
        return "settled"
    if status in ("planned", "awaiting_approval", "waiting_user"):
        return "keep"
    if allows_retry(guarantee):
        return "retry"  # an interrupted read returns to planned
    if status == "verifying" and predicates and all(p.type in STATE_PREDICATES for p in predicates):
        return "verify"  # the effect ran; independent file observations may still prove it
    return "recovery_required"
