"""One provider step, idempotent through the ledger.

The step's identity is ``<runId>:<k>`` (``refs.stepId`` on every event it commits). A retry — after
a crash, a timeout, a lost response, or a local activity re-run on replay — finds the committed
output in the committed view and returns it without calling the provider again. Provider history
comes from the ledger (``legal_replay``), never from workflow state; the result carries ids only.
The step's token usage commits with its output; a policy's token caps are checked from that
committed usage before the provider is called (``check_usage``), never during a call.

Before the call, a history past the step's budget is compacted (``compaction``): the model, offered
no tools, summarizes the oldest part, and the summary commits as a fact (``<stepId>:compaction``)
before the step sends it; a vendor's ``provider_context_length_exceeded`` compacts once the same
way instead of failing the step. A retried step reuses the committed summary.

A step runs in its own activity (a local one by default) or, in ``with_tool`` mode, in the tool
activity of the previous step's last call (``execute_tool_then_step``), after that call's T2: the
same function, so the same idempotence, with the tool attempt heartbeated while the provider answers.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Collection
from typing import Any, NamedTuple

from maka_core import failpoints
from maka_core.errors import CodecError, LedgerRejection, UsageLimitReached
from maka_core.facts import canonical_json
from maka_core.facts.clock import now_ms
from maka_core.facts.events import RuntimeEvent
from maka_core.facts.usage import step_tokens
from maka_core.governance.policy_file import UsageLimits
from maka_core.observe import MODEL_TOKENS
from maka_core.providers import ModelOutput, Provider, ProviderError, ScriptedProvider
from maka_core.providers.spec import context_budget, parse_provider_spec
from maka_core.runtime import (
    call_state,
    compaction,
    governed,
    local_calls,
    step_output,
    step_stream,
    tool_call,
)
from maka_core.runtime.agent_usage import NO_SUB_AGENTS, SubAgentUsage, sub_agent_usage
from maka_core.runtime.call_limit import refuse_excess_calls
from maka_core.runtime.call_order import in_call_order
from maka_core.runtime.contracts import (
    CallRef,
    ModelStepInput,
    ModelStepResult,
    RunIds,
    ToolInput,
    ToolOutcome,
)
from maka_core.runtime.runtime import Attempt, Runtime
from maka_core.runtime.usage_limits import CAPS, limits_in_force, next_call_tokens
from maka_core.tools.contract import parallel_safe
from maka_core.tools.targets import call_targets

log = logging.getLogger(__name__)


def _result(
    rt: Runtime, step_id: str, committed: tuple[RuntimeEvent, ...], replayed: bool
) -> ModelStepResult:
    calls = []
    for event in committed:
        content = event.content
        if content is None or content.kind != "function_call" or event.refs is None:
            continue
        tool = rt.tools.get(content.name)
        guarantee = (
            governed.guarantee_of(tool, governed.classify(tool, content.args))
            if tool is not None and isinstance(content.args, dict)
            else None
        )
        calls.append(
            CallRef(
                tool_call_id=content.id,
                operation_id=event.refs.operation_id or "",
                tool_name=content.name,
                # A read-only call may be retried by Temporal; every other call never is.
                read_only=guarantee == "read-only" or None,
                bounded=(tool is not None and local_calls.is_bounded(tool, guarantee)) or None,
                parallel=(tool is not None and parallel_safe(tool, guarantee)) or None,
                targets=call_targets(tool, content.args) if isinstance(content.args, dict) else None,
            )
        )
    return ModelStepResult(step_id=step_id, calls=calls, final=not calls, replayed=replayed or None)


def output_size(output: ModelOutput) -> int:
    """The bytes a step's output commits: its text and each call's name and canonical arguments."""
    size = len((output.text or "").encode("utf-8"))
    for call in output.tool_calls:
        try:
            args = canonical_json.dumps(dict(call.args))
        except CodecError:  # not JSON at all: the commit refuses it with its own code
            args = ""
        size += len(call.name.encode("utf-8")) + len(args.encode("utf-8"))
    return size


def _check_size(output: ModelOutput, limit: int, step_id: str) -> None:
    """Refuse an output larger than ``limit`` before anything of it is committed: one row that
    size would be read back and replayed to the provider by every later step of the session.
    Not retryable (the same history asks for the same answer); the turn fails with the code."""
    size = output_size(output)
    if size > limit:
        raise ProviderError(
            "model_output_too_large",
            f"the model's output for step {step_id} is {size} bytes, over the limit of {limit} "
            f"(MAKA_MODEL_OUTPUT_MAX_BYTES); nothing of it was committed",
            retryable=False,
            stepId=step_id,
            size=size,
            limit=limit,
        )


#: Maka's ``tokenUsage`` counts the counter reports, by its ``kind`` label.
_TOKEN_KINDS = (("input", "input"), ("output", "output"), ("cached", "cacheRead"))


def check_usage(
    limits: UsageLimits | None,
    events: list[RuntimeEvent],
    ids: RunIds,
    step_id: str,
    before: int = 0,
    sent: list[RuntimeEvent] | None = None,
    below: SubAgentUsage = NO_SUB_AGENTS,
) -> None:
    """Refuse the next provider call when it would take the turn or the session past a cap.

    From committed usage only: the turn's and session's summed ``step_tokens``, plus the next call
    estimated at the session's last model step (the history a call sends only grows, so the next
    call costs at least what the last one did; ``sent``: at least that history's estimate), plus
    ``before``: the estimated tokens of a call the step makes first (its compaction). Checked
    before the call, so a cap is never passed mid-call and never by a call this check could
    foresee; a step that compacts is checked again after the compaction commits (its usage with
    it), before its own call.

    The caps are the policy's with the operator's raises among ``events`` applied
    (``usage_limits.limits_in_force``). ``below``: what the session's sub-agents spent, which its
    caps cover (``agent_usage``; in ``used``, and in the refusal's ``subAgents`` when not 0).

    Raises:
        UsageLimitReached: ``usage_limit_reached`` with ``limit`` (the policy field), ``cap`` (the
            cap in force), ``used``, ``next`` (the estimate), and ``raised: true`` when an operator raised it.
    """
    policy, limits = limits, limits_in_force(limits, events)
    if limits is None or (limits.max_tokens_per_turn is None and limits.max_tokens_per_session is None):
        return
    session = turn = 0
    for e in events:
        usage = e.actions.token_usage if e.actions is not None else None
        if not usage:
            continue
        tokens = step_tokens(usage)
        session += tokens
        if e.run_id == ids.run_id:
            turn += tokens
    last = next_call_tokens(events, sent)
    for field, cap, used, theirs in (
        ("usage.maxTokensPerTurn", limits.max_tokens_per_turn, turn + below.turn, below.turn),
        ("usage.maxTokensPerSession", limits.max_tokens_per_session, session + below.session, below.session),
    ):
        if cap is not None and (used >= cap or used + before + last > cap):
            # An operator may have raised the policy's cap (``maka session raise-limit``).
            raised = policy is not None and getattr(policy, CAPS[field.removeprefix("usage.")]) != cap
            refused = UsageLimitReached(
                message=(
                    f"step {step_id}: {used} tokens used"
                    + (f" ({theirs} of them by its sub-agents)" if theirs else "")
                    + f" and about {before + last} more for the next "
                    f"call{'s' if before else ''} would pass the cap in force, {field} of {cap}; "
                    "no provider call was made"
                ),
                stepId=step_id,
                limit=field,
                cap=cap,
                used=used,
                next=before + last,
            )
            if raised:
                refused.detail["raised"] = True
            if theirs:
                refused.detail["subAgents"] = theirs
            raise refused


class Found(NamedTuple):
    """What a step reads from the ledger before it runs."""

    #: Its committed output (empty: not run yet).
    committed: tuple[RuntimeEvent, ...]
    #: The session-wide step index.
    step_index: int
    #: The provider history (empty when the provider does not read it).
    history: list[RuntimeEvent]
    #: The compaction to run first (``None``: the history fits its budget, or cannot be compacted).
    plan: compaction.CompactionPlan | None
    #: The session's committed call ids: the committed view's own set, read (only) on the ledger
    #: thread when the step commits, so a new call's id is decided without another read.
    call_ids: Collection[str]


def _needs_history(provider: Provider) -> bool:
    # A scripted provider answers by step index alone; skip assembling a history it never reads
    # (unless a call refers to an earlier result).
    return not isinstance(provider, ScriptedProvider) or provider.refers_to_results


def _lookup(
    rt: Runtime, ids: RunIds, step_id: str, needs_history: bool, spec: Any, overflow: int | None = None
) -> Found:
    """On the ledger thread: the step's committed output, step index, history, and the compaction
    it needs first. ``overflow``: the vendor refused a request of about this many tokens as past
    its window (the compaction then aims at half of it, or of the budget if smaller)."""
    view = rt.ledger.view(ids.session_id)
    committed = view.step_events(step_id)
    history: list[RuntimeEvent] = []
    plan = None
    limits = rt.session_governance(ids.session_id).policy.usage if not committed else None
    if (needs_history or limits is not None) and not committed:
        # From the session's resident scope: only the rows committed since the last step are read.
        events = rt.ledger.session_events(ids.session_id)
        if needs_history:
            # An operator-resolved call is shown with a result stating the decision (never re-run).
            found = compaction.history_view(events)
            history = in_call_order(found.sent)  # results as the calls were asked (run side by side)
            plan = _plan(rt, ids, step_id, spec, events, found, overflow)
        below = _sub_agents(rt, events, ids) if step_output.capped(limits) else NO_SUB_AGENTS
        check_usage(limits, events, ids, step_id, before=_compaction_cost(plan), below=below)
    # Session-wide step index: the script (or any provider) continues where the session is.
    return Found(committed, view.step_count(ids.session_id), history, plan, view.call_ids)


def _compaction_cost(plan: compaction.CompactionPlan | None) -> int:
    """The tokens a compaction's request is estimated at (its answer is short): a step that
    compacts makes two calls, and the cap check before it counts both."""
    return compaction.estimate_tokens([plan.request]) if plan is not None else 0


def _check_usage_after_compaction(
    rt: Runtime, ids: RunIds, step_id: str, events: list[RuntimeEvent], sent: list[RuntimeEvent]
) -> None:
    """The cap check again once the compaction's usage is committed, before the step's own call
    (estimated at the session's last model step, or at the summary and tail it sends if more)."""
    limits = rt.session_governance(ids.session_id).policy.usage
    below = _sub_agents(rt, events, ids) if step_output.capped(limits) else NO_SUB_AGENTS
    check_usage(limits, events, ids, step_id, sent=sent, below=below)


def _sub_agents(rt: Runtime, events: list[RuntimeEvent], ids: RunIds) -> SubAgentUsage:
    """On the ledger thread: what the session's sub-agents spent (``agent_usage``)."""
    return sub_agent_usage(lambda child: rt.ledger.events(session_id=child), events, ids.run_id)


def _plan(
    rt: Runtime,
    ids: RunIds,
    step_id: str,
    spec: Any,
    events: list[RuntimeEvent],
    found: compaction.HistoryView,
    overflow: int | None,
) -> compaction.CompactionPlan | None:
    """The compaction a step must run before its call, if its history passes the budget (or the
    vendor said it passed the window)."""
    try:
        parsed = parse_provider_spec(spec)
    except Exception:  # an unusable spec: the provider refuses it with its own code
        return None
    budget = context_budget(parsed)
    system = getattr(parsed, "system", None)
    overhead = compaction.estimate_tokens((), rt.tool_specs(), system)
    estimate = overhead + compaction.estimate_tokens(found.sent)
    if overflow is None and (budget is None or estimate <= budget):
        return None
    limit = min(x for x in (budget, overflow) if x is not None) if overflow is not None else budget
    assert limit is not None
    return compaction.plan_compaction(
        ids,
        step_id,
        events,
        found,
        # The tail keeps a share of what the tools and system prompt leave of the limit.
        target=int(max(limit - overhead, 0) * compaction.TAIL_SHARE),
        trigger="budget" if overflow is None else "context_length_exceeded",
        estimate=estimate,
        budget=budget,
    )


async def _call(
    rt: Runtime, call_id: str, make: Callable[[], Awaitable[ModelOutput]], attempt: Attempt | None
) -> ModelOutput:
    """One provider call, heartbeating ``attempt`` meanwhile: refused before its request once the
    worker is stopping, cut at the worker's graceful timeout (``runtime.model_calls``:
    ``WorkerStopping``, nothing committed)."""

    def counted() -> Awaitable[ModelOutput]:
        rt.record_provider_call(call_id)
        return make()

    return await rt.heartbeating(rt.model_calls.call(call_id, counted), attempt)


async def _compact(
    rt: Runtime,
    spec: Any,
    provider: Provider,
    ids: RunIds,
    step_id: str,
    plan: compaction.CompactionPlan,
    step_index: int,
    attempt: Attempt | None,
) -> list[RuntimeEvent]:
    """Run one compaction: the summarizing call (no tools), then its fact, committed before any
    step sends it. Returns the history the step sends. Another attempt's committed fact wins (a
    worker presumed dead that got there first): its summary is the one used, never ours."""
    failpoints.hit("compaction_started")
    output = await _call(
        rt,
        compaction.compaction_id(step_id),
        lambda: provider.complete([plan.request], [], step_index=step_index),
        attempt,
    )
    try:
        _check_size(output, rt.settings.model_output_max_bytes, step_id)  # every later step sends it
        usage = _checked_usage(rt, ids, compaction.compaction_id(step_id), output)
    except ProviderError as refusal:
        rt.model_calls.refuse(step_id, refusal)
        raise
    summary = (output.text or "").strip()
    if not summary or output.tool_calls:
        raise ProviderError(
            "provider_invalid_response",
            f"step {step_id}: the compaction call answered no summary text",
            retryable=True,
            stepId=step_id,
        )
    fact = plan.fact(step_id, summary)
    event = compaction.compaction_event(ids, step_id, fact, now_ms(), usage)
    failpoints.hit("compaction_answered")
    committed_here = True
    try:
        await rt.on_ledger(lambda: rt.ledger.append([event]), attempt=attempt)
    except LedgerRejection as exc:
        if exc.code != "duplicate_event_id":
            raise
        committed_here = False

    def reread() -> tuple[list[RuntimeEvent], compaction.HistoryView]:
        events = rt.ledger.session_events(ids.session_id)
        return events, compaction.history_view(events)

    events, found = await rt.on_ledger(reread, attempt=attempt)
    if found.compaction is None or found.compaction.event_id != fact.event_id:
        raise ProviderError(
            "compaction_unusable", f"step {step_id}: the committed compaction is not in force", stepId=step_id
        )
    failpoints.hit("compaction_committed")
    log.info(
        "step %s: compacted %d history events (%s, about %d tokens)",
        step_id,
        fact.covered_events,
        fact.trigger,
        fact.estimate,
    )
    if committed_here:
        _count_tokens(rt, spec, [event])
    # The session's policy was read (and cached) by this step's lookup: no ledger read here.
    _check_usage_after_compaction(rt, ids, step_id, events, found.sent)
    return found.sent


async def model_step(
    rt: Runtime, inp: ModelStepInput, attempt: Attempt | None = None, found: Found | None = None
) -> ModelStepResult:
    """Return step ``k``'s committed output, or call the provider once and commit it.

    ``attempt``: heartbeat it while the provider answers (a step riding in a tool activity, whose
    heartbeat timeout is a tool's, not a model call's). ``found``: the step's ledger state, already
    read on the ledger thread (a riding step reads it in its call's T2 hop)."""
    ids = inp.ids
    step_id = f"{ids.run_id}:{inp.step}"
    if inp.after_tools:
        failpoints.hit("P7")
    provider = rt.provider(inp.provider)
    needs_history = _needs_history(provider)

    def lookup() -> Found:
        return _lookup(rt, ids, step_id, needs_history, inp.provider)

    if found is None:
        found = await rt.on_ledger(lookup, attempt=attempt)
    committed, step_index, history, plan, taken = found
    if committed:
        return await refuse_excess_calls(rt, ids, _result(rt, step_id, committed, replayed=True), attempt)
    refused = rt.model_calls.refusal(step_id)
    if refused is not None:
        raise refused  # this worker refused the step's answer already: the vendor is not asked again
    compacted = plan is not None
    # The lookup above read the session's policy on the ledger thread (cached since).
    tools = rt.tool_specs(rt.offered(ids.session_id, inp.tool_set))
    if plan is not None:
        history = await _compact(rt, inp.provider, provider, ids, step_id, plan, step_index, attempt)
    streaming = step_stream.streams(provider, inp.stream)

    def ask() -> Awaitable[ModelOutput]:
        if streaming is None:
            return provider.complete(history, tools, step_index=step_index)
        labels = _labels(inp.provider)
        return step_stream.streamed(rt, streaming, ids, step_id, history, tools, step_index, labels)

    try:
        output = await _call(rt, step_id, ask, attempt)
    except ProviderError as exc:
        if exc.code != "provider_context_length_exceeded" or compacted:
            raise
        # Past the vendor's window: compact once, then send the shorter history.
        sent = compaction.estimate_tokens(
            history, tools, getattr(parse_provider_spec(inp.provider), "system", None)
        )
        again = await rt.on_ledger(
            lambda: _lookup(rt, ids, step_id, needs_history, inp.provider, overflow=sent), attempt=attempt
        )
        if again.committed or again.plan is None:
            raise
        history = await _compact(rt, inp.provider, provider, ids, step_id, again.plan, step_index, attempt)
        output = await _call(rt, step_id, ask, attempt)
    try:
        _check_size(output, rt.settings.model_output_max_bytes, step_id)
        usage = _checked_usage(rt, ids, step_id, output)
    except ProviderError as refusal:
        rt.model_calls.refuse(step_id, refusal)
        raise
    ts = now_ms()
    ops = [f"op-{uuid.uuid4()}" for _ in output.tool_calls]
    batch: list[RuntimeEvent] = []

    def commit() -> None:
        # On the ledger thread, which alone folds ``taken``: the calls' ids are decided against the
        # session's committed ones as of the step's lookup (nothing else commits a call to this
        # session meanwhile but another attempt of this very step, whose events would collide first).
        batch[:] = step_output.step_batch(ids, step_id, output, usage, ops, taken, ts)
        rt.ledger.append(batch)
        if streaming is not None:
            step_stream.clear_after_commit(rt, step_id)

    if output.tool_calls:
        failpoints.hit("P0")
    try:
        await rt.on_ledger(commit, attempt=attempt)
    except LedgerRejection as exc:
        if exc.code != "duplicate_event_id":
            raise
        # Another attempt of this step committed first (a worker presumed dead that was still
        # running): its output is the step's output; ours was never committed or acted on.
        committed = (await rt.on_ledger(lookup)).committed
        if not committed:
            raise
        if streaming is not None:
            await rt.on_ledger(lambda: step_stream.clear_after_commit(rt, step_id))
        return await refuse_excess_calls(rt, ids, _result(rt, step_id, committed, replayed=True), attempt)
    if output.tool_calls:
        failpoints.hit("P1")
    _count_tokens(rt, inp.provider, batch)
    return await refuse_excess_calls(rt, ids, _result(rt, step_id, tuple(batch), replayed=False), attempt)


def _checked_usage(rt: Runtime, ids: RunIds, step_id: str, output: ModelOutput) -> dict[str, Any] | None:
    """The answer's usage as it may commit (``step_output.checked_usage``: ``usage_invalid``
    otherwise). The session's policy was read (and cached) by the step's lookup."""
    caps = step_output.capped(rt.session_governance(ids.session_id).policy.usage)
    return step_output.checked_usage(output.usage, step_id, caps=caps)


def _count_tokens(rt: Runtime, recorded: Any, batch: list[RuntimeEvent]) -> None:
    """Count the usage this step just committed (a replayed step counts nothing). Labels: the
    spec's kind and model name only, never a key or base URL."""
    usage = next((e.actions.token_usage for e in batch if e.actions and e.actions.token_usage), None)
    if not usage:
        return
    labels = _labels(recorded)
    for kind, key in _TOKEN_KINDS:
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            rt.observer.count(MODEL_TOKENS, value, **labels, kind=kind)


def _labels(recorded: Any) -> dict[str, str]:
    """A step's metric labels: the spec's kind and model name only, never a key or base URL."""
    spec = parse_provider_spec(recorded)  # the step's provider was built from it: it parses
    return {"provider": spec.kind, "model": getattr(spec, "model", None) or spec.kind}


async def execute_tool_then_step(
    rt: Runtime, inp: ToolInput, attempt: Attempt, *, local: bool = False
) -> ToolOutcome:
    """Run one call (``tool_call.execute_tool``), then, if the workflow asked (``inp.next_step``),
    the model step that follows it, in the same activity: the step's output rides back on the
    outcome.

    The order is the protocol's: the step starts only after the call's T2 is committed, so the model
    sees a result the ledger already holds. The step reads its ledger state in T2's own hop, right
    after the commit. The step is best effort here and exact everywhere: it is idempotent through
    the ledger, so when it fails (a provider error, a crash after T2) the outcome still returns
    without it, and the workflow runs the step on its own, with the model step's retry policy,
    finding the output if this attempt committed it.
    """
    began = time.perf_counter()
    try:
        return await _execute_tool_then_step(rt, inp, attempt, local)
    finally:
        rt.timings["tool_activity"] += time.perf_counter() - began


async def _execute_tool_then_step(rt: Runtime, inp: ToolInput, attempt: Attempt, local: bool) -> ToolOutcome:
    after = inp.next_step
    if after is None:
        alone, _ = await tool_call.execute_tool_then(rt, inp, attempt, None, local=local)
        return alone
    try:
        needs_history = _needs_history(rt.provider(after.provider))
    except Exception:  # an unusable provider: the step's own activity reports it
        needs_history = True

    def read_step() -> tuple[RunIds, Found] | None:
        # Runs inside T2's hop, after its commit: a failure here must not look like T2's.
        try:
            ids = call_state.run_ids(rt.ledger.view(inp.session_id), inp.session_id, inp.run_id)
            if ids is None:
                return None
            return ids, _lookup(rt, ids, f"{ids.run_id}:{after.step}", needs_history, after.provider)
        except UsageLimitReached:
            return None  # an expected park: the step's own activity raises it for the workflow
        except Exception:
            log.exception("reading model step %s:%d after its call failed", inp.run_id, after.step)
            return None

    outcome, read = await tool_call.execute_tool_then(rt, inp, attempt, read_step, local=local)
    if outcome.status == "awaiting_approval" or outcome.cancelled:
        return outcome  # the call has not settled, or its turn is cancelled: no step follows it
    try:
        if read is None:  # the call did not run here (refused, replayed), or the read failed
            ids = await rt.on_ledger(
                lambda: call_state.run_ids(rt.ledger.view(inp.session_id), inp.session_id, inp.run_id)
            )
            found = None
        else:
            ids, found = read
        # The call just settled, so its run is in the ledger.
        assert ids is not None
        step_input = ModelStepInput(
            ids=ids,
            step=after.step,
            workspace=inp.workspace,
            provider=after.provider,
            after_tools=True,
            tool_set=inp.tool_set,
            stream=after.stream,
        )
        step = await model_step(rt, step_input, attempt, found)
    except Exception as exc:
        log.warning(
            "model step %s:%d after a tool call did not complete here (%s); the workflow runs it",
            inp.run_id,
            after.step,
            getattr(exc, "code", type(exc).__name__),
        )
        return outcome
    return outcome.model_copy(update={"next_step": step})
