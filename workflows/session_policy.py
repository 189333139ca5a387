"""The session workflow's fixed choices: retry policies, timeouts, patch ids, search attributes,
and the internal signals (exceptions) that end a turn. Declared once; ``session`` and
``session_calls`` share them."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

with workflow.unsafe.imports_passed_through():
    from maka_temporal.workflows.contracts import SA_PARK_REASON, SA_SESSION_ID, SA_STATE, ParkReason

SESSION_ID_KEY = SearchAttributeKey.for_keyword(SA_SESSION_ID)
STATE_KEY = SearchAttributeKey.for_keyword(SA_STATE)
PARK_REASON_KEY = SearchAttributeKey.for_keyword(SA_PARK_REASON)

#: Ledger-only activities (begin/finish run): idempotent by deterministic event ids, so retry freely.
LEDGER_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=10)
)
#: Model steps: bounded; the provider client's own retries are off, so this is the only retry layer.
MODEL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30), maximum_attempts=5
)
#: Side-effect tools run at most once per dispatch; read-only tools may retry a little.
SIDE_EFFECT_RETRY = RetryPolicy(maximum_attempts=1)
READ_ONLY_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=500), maximum_attempts=3)
#: Recovery is ledger work plus a read of the target: retryable, bounded, with backoff.
RECOVERY_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10), maximum_attempts=6
)
#: Ledger-only activities take milliseconds; a short start-to-close is how Temporal notices that the
#: worker running one died (they do not heartbeat), and a retry is an exact, idempotent retry.
LEDGER_TIMEOUT = timedelta(seconds=10)
#: A call the Resolver proves never dispatched may be dispatched again, a bounded number of times.
MAX_DISPATCHES = 3
#: The park of a session whose workspace host did not start its work within the host wait.
HOST_UNAVAILABLE: ParkReason = "workspace_host_unavailable"
#: Executions that began with this patch hold a call's approval wait themselves (a condition and a
#: timer at ``expiresAt``, answered by the ``approve``/``deny`` Updates) and run each turn as a task
#: that ``cancel_turn`` can cancel. Recorded before it, an execution waits inside the tool activity
#: and its turns cannot be cancelled (``turn_not_cancellable``): its history replays unchanged.
TURN_MESSAGES_PATCH = "maka-turn-messages-1"
#: Executions of a ``tool_mode="hybrid"`` session that began with this patch run a bounded call's
#: first dispatch as a local activity (``runtime.local_calls``). Asked only when the session's
#: config says ``hybrid``, so no history recorded before it (none says so) changes.
LOCAL_TOOLS_PATCH = "maka-local-tools-1"
#: The calls of one model step run side by side (``workflows.fanout``, issue 31), up to the
#: session's ``max_parallel_tools``. Asked only for a step of several calls in a session whose
#: config allows more than one at a time, so every history recorded before keeps its commands.
PARALLEL_TOOLS_PATCH = "maka-parallel-tools-1"
#: Side by side, a call waits for each earlier call of its step it conflicts with (``fanout.conflicts``:
#: a shared workspace target, not both read-only). Asked only for a step that has such a pair, so a
#: history recorded before (no call named targets) keeps its commands.
PARALLEL_ORDER_PATCH = "maka-parallel-order-1"
#: Asked at each execution's start, with the patches above and before its first local activity:
#: the execution runs a step's calls side by side, keeps conflicting calls in order and dispatches
#: sub-agent calls as child sessions without asking ``PARALLEL_TOOLS_PATCH``,
#: ``PARALLEL_ORDER_PATCH`` or ``SUBAGENTS_PATCH``. Those were asked right after the model step, a
#: local activity, and a replay takes a local activity's result from its marker at once: when the
#: execution had taken the step's result in a later workflow task than the one that recorded the
#: marker (the server handed it a new task at once: an Update, say, had come meanwhile), the
#: replay asked the patch a task early, where its marker was not yet in sight, was told False and
#: failed nondeterministic. Hence the rule: never ask a patch in code that runs straight after a
#: local activity; ask it here. Executions recorded before it ask the three as they did.
STEP_PATCHES = "maka-step-patches-1"


def host_away(err: BaseException) -> bool:
    """True when an activity failed because no worker of its queue started it within its
    schedule-to-start bound: on a host queue, the host is away. Temporal never retries that
    timeout, and nothing ran (the attempt never started), so the session parks and waits for the
    host; any other failure goes to recovery as before."""
    cause = err.cause if isinstance(err, ActivityError) else None
    return isinstance(cause, TemporalTimeoutError) and cause.type == TimeoutType.SCHEDULE_TO_START


def initial_search_attributes(session_id: str) -> TypedSearchAttributes:
    """Search attributes a new session workflow starts with."""
    return TypedSearchAttributes(
        [SearchAttributePair(SESSION_ID_KEY, session_id), SearchAttributePair(STATE_KEY, "idle")]
    )


class HandOff(Exception):
    """Internal: the turn's run belongs to another execution; close and leave it to a resume."""


class Cancelled(Exception):
    """Internal: ``cancel_turn`` stopped the turn; the run ends ``cancelled``."""


class Park(Exception):
    """Internal: the turn parks on an operation (never leaves the session workflow's modules)."""

    def __init__(self, reason: ParkReason, operation_id: str | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.operation_id = operation_id


def now_ms() -> int:
    return int(workflow.now().timestamp() * 1000)


def describe(err: Exception) -> str:
    cause = err.cause if isinstance(err, ActivityError) else err
    if isinstance(cause, ApplicationError):
        return f"{cause.type or 'ApplicationError'}: {cause.message}"
    return str(cause or err)
