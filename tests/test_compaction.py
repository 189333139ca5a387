"""Compaction as a fact, on the runtime (no Temporal): real ``openai`` and ``anthropic`` SDK clients
against a local server with a small window (``tests/windowed_vendor.py``), real SQLite, real files.

- A long session whose history is several times the window runs to the end: every request the
  vendor received fits its window, and equals the request rebuilt from the ledger alone
  (``step_request``, ``compaction_request_of``); each compaction fact checks out
  (``check_compactions``) and the continuation planner decides as it would without them.
- A model whose window is unknown to maka (no budget): the vendor's context-length 400 compacts
  once and the step succeeds; negative control: the same step with compaction off fails with
  ``provider_context_length_exceeded``, as every step did before.
- A retried step reuses the committed summary (no second summarizing call) and sends what the
  ledger says; negative control: a step that does not see the committed fact (its ledger read
  drops it) asks the model for a second summary of the same history.
- ``maka audit``'s check re-derives each fact; a tampered one (digest, range, high-water, a cut
  inside a call pair) is reported.
- An unsettled call and a park stay verbatim in the tail; a cut never splits a call pair.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterator
from typing import Any

import pytest

from maka_core.errors import ConfigError, MakaError, UsageLimitReached
from maka_core.facts import canonical_json
from maka_core.facts.usage import step_tokens
from maka_core.governance import parse_policy
from maka_core.ledger.digests import read_prefix
from maka_core.ledger.provider_replay import replay_segment
from maka_core.ledger.resume_plan import legal_replay, plan_resume
from maka_core.providers.anthropic_messages import history_to_messages as anthropic_messages
from maka_core.providers.openai_compat import history_to_messages as openai_messages
from maka_core.providers.spec import context_budget, model_spec, parse_provider_spec
from maka_core.runtime import compaction, model_step, tool_call, turn
from maka_core.runtime.contracts import BeginRunInput, FinishRunInput, ModelStepInput, RunIds, ToolInput
from maka_core.runtime.governed import SessionGovernance
from maka_core.runtime.resolution import is_resolution_run
from maka_core.runtime.runtime import Attempt, Runtime
from maka_core.runtime.usage_limits import raise_limit
from maka_core.store.writer import LedgerStore, ToolAttempt
from maka_core.workspace import Workspace
from tests import ledger_factory as lf
from tests.windowed_vendor import WindowedVendor

WINDOW = 8000
SESSION = "s-compact"

#: The tests that exercise a provider's messages or a planner's logic over the facts, not the store,
#: run on one backend. A fact's write and read keep PostgreSQL beside SQLite in the long session
#: (openai), and a retried step's read of its committed fact keeps all three backends.
ONE_BACKEND = pytest.mark.parametrize("store_url", ["sqlite-file"], indirect=True)


@pytest.fixture
def vendor(monkeypatch: pytest.MonkeyPatch) -> Iterator[WindowedVendor]:
    server = WindowedVendor(WINDOW)
    monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    yield server
    server.close()


def _spec(kind: str, window: int | None = WINDOW) -> dict[str, Any]:
    spec: dict[str, Any] = {"kind": kind, "model": "window-model"}
    if window is not None:
        spec["contextWindow"] = window
    return spec


def _ids(n: int) -> RunIds:
    return RunIds(session_id=SESSION, turn_id=f"t{n}", run_id=f"r{n}", invocation_id=f"i{n}")


async def _turn(rt: Runtime, ws: Workspace, n: int, spec: dict[str, Any], *, end: bool = True) -> None:
    """One user turn, as the workflow drives it: begin, steps and their calls, finish."""
    ids = _ids(n)
    await turn.begin_run(
        rt,
        BeginRunInput(
            ids=ids, text=f"turn {n}", ts=n, workflow_id="wf", workflow_run_id="wr", task_queue="q",
            workspace=str(ws.root),
        ),
    )  # fmt: skip
    k = 0
    while True:
        inp = ModelStepInput(ids=ids, step=k, workspace=str(ws.root), provider=spec, after_tools=k > 0)
        result = await model_step.model_step(rt, inp)
        if result.final:
            break
        for i, ref in enumerate(result.calls):
            attempt = Attempt(record=ToolAttempt("wf", "wr", f"{n}-{k}-{i}", 1))
            tool = ToolInput(
                session_id=SESSION, run_id=ids.run_id, call=ref, workspace=str(ws.root),
                workspace_identity=ws.identity,
            )  # fmt: skip
            await tool_call.execute_tool(rt, tool, attempt)
        k += 1
    if end:
        await turn.finish_run(rt, FinishRunInput(ids=ids, status="completed", ts=n))


def _messages(kind: str, history: list[Any]) -> list[dict[str, Any]]:
    return anthropic_messages(history) if kind == "anthropic" else openai_messages(history)


def _rebuilt(events: list[Any], kind: str) -> list[list[dict[str, Any]]]:
    """Every request the session sent, in order, rebuilt from the ledger alone."""
    out: list[list[dict[str, Any]]] = []
    steps: list[str] = []
    for e in events:
        if compaction.CompactionFact.of(e) is not None:
            request = compaction.compaction_request_of(events, e)
            assert request is not None, e.id
            out.append(_messages(kind, [request]))
        elif e.role == "model" and e.refs is not None and e.refs.step_id not in steps:
            steps.append(str(e.refs.step_id))
            sent = compaction.step_request(events, str(e.refs.step_id))
            assert sent is not None
            out.append(_messages(kind, sent))
    return out


@pytest.mark.parametrize(
    ("store_url", "kind"),
    [("sqlite-file", "openai"), ("postgres", "openai"), ("sqlite-file", "anthropic")],
    indirect=["store_url"],
)
def test_a_long_session_several_windows_long_runs_to_the_end(
    rt: Runtime, ws: Workspace, vendor: WindowedVendor, kind: str
) -> None:
    turns = 100
    spec = _spec(kind)

    async def go() -> None:
        for n in range(turns):
            await _turn(rt, ws, n, spec)

    asyncio.run(go())
    events = rt.ledger.events(session_id=SESSION)
    facts = [f for f in map(compaction.CompactionFact.of, events) if f is not None]
    history = compaction.history_view(events).history
    whole = compaction.estimate_tokens(history, rt.tool_specs())
    print(f"{kind}: {turns} turns, {len(events)} events, history ~{whole} tokens (window {WINDOW}), "
          f"{len(facts)} compactions, {len(vendor.requests)} requests")  # fmt: skip
    assert whole > 3 * WINDOW, "the session's history is several windows long"
    assert len(facts) >= 3 and vendor.summaries == len(facts) and vendor.overflows == 0
    assert all(vendor.tokens(r.body) <= WINDOW for r in vendor.requests)
    assert sorted(p.name for p in (ws.root / "notes").iterdir()) == sorted(f"{n}.txt" for n in range(turns))
    # Each compaction extends the one before, and each fact checks out against the ledger.
    assert [f.previous_id for f in facts[1:]] == [f.event_id for f in facts[:-1]]
    assert compaction.check_compactions(events) == []
    # What the vendor got is what the ledger says each step sent.
    assert [r.body["messages"] for r in vendor.requests] == _rebuilt(events, kind)
    # The last step sent a summary first, then the tail, not the whole history.
    last = vendor.requests[-1].body["messages"]
    first_text = last[0]["content"] if kind == "openai" else last[0]["content"][0]["text"]
    assert first_text.startswith("[Summary of the earlier conversation") and "summary #" in first_text


def test_the_budget_is_the_window_less_a_reserve_with_defaults_per_known_model() -> None:
    assert context_budget(parse_provider_spec(_spec("openai", 10_000))) == 8_000
    assert context_budget(parse_provider_spec({**_spec("openai", 10_000), "maxTokens": 4000})) == 6_000
    assert context_budget(parse_provider_spec({**_spec("openai", 10_000), "contextReserve": 500})) == 9_500
    assert context_budget(parse_provider_spec({"kind": "anthropic", "model": "claude-sonnet-4-5"})) == 160_000
    assert context_budget(parse_provider_spec({"kind": "openai", "model": "gpt-4o-mini"})) == 102_400
    assert context_budget(parse_provider_spec({"kind": "openai", "model": "my-local-llama"})) is None
    assert context_budget(parse_provider_spec({"kind": "script", "steps": []})) is None
    # What --context-window / --context-reserve record, and what they refuse.
    assert model_spec("openai:m", context_window=9000, context_reserve=1000).to_json() == {
        "kind": "openai", "model": "m", "contextWindow": 9000, "contextReserve": 1000,
    }  # fmt: skip
    for window, reserve in ((0, None), (9000, 9000), (None, -1)):
        with pytest.raises(ConfigError) as info:
            model_spec("anthropic:claude-x", context_window=window, context_reserve=reserve)
        assert info.value.code == "config_invalid", (window, reserve)


@ONE_BACKEND
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_context_length_400_compacts_once_instead_of_failing(
    rt: Runtime, ws: Workspace, vendor: WindowedVendor, kind: str
) -> None:
    """The model's window is unknown to maka (no budget): only the vendor can say it is past it."""
    spec = _spec(kind, window=None)

    async def go() -> None:
        for n in range(40):
            await _turn(rt, ws, n, spec)

    asyncio.run(go())
    events = rt.ledger.events(session_id=SESSION)
    facts = [f for f in map(compaction.CompactionFact.of, events) if f is not None]
    assert vendor.overflows >= 1 and len(facts) == vendor.overflows, (vendor.overflows, len(facts))
    assert {f.trigger for f in facts} == {"context_length_exceeded"}
    assert compaction.check_compactions(events) == []
    ok = [r.body["messages"] for r in vendor.requests if vendor.tokens(r.body) <= WINDOW]
    assert ok == _rebuilt(events, kind)


@ONE_BACKEND
def test_negative_control_without_compaction_the_400_fails_the_step(
    rt: Runtime, ws: Workspace, vendor: WindowedVendor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Today's behaviour before compaction: the 400 is permanent and every later step fails too."""
    monkeypatch.setattr(model_step, "_plan", lambda *a, **k: None)
    spec = _spec("openai", window=None)

    async def go() -> None:
        for n in range(40):
            await _turn(rt, ws, n, spec)

    with pytest.raises(MakaError) as info:
        asyncio.run(go())
    assert info.value.code == "provider_context_length_exceeded"


def _crash_after_compaction(rt: Runtime, ws: Workspace, spec: dict[str, Any]) -> tuple[int, int]:
    """Run turns until a step compacts, and stop that step right after its fact commits, before its
    own call (as a crash there would): returns the turn and step index."""

    class Crash(Exception):
        pass

    real = model_step._compact
    where: list[str] = []

    async def compact_then_crash(*args: Any, **kw: Any) -> Any:
        await real(*args, **kw)
        where.append(args[4])  # the step id
        raise Crash

    async def go() -> tuple[int, int]:
        model_step._compact = compact_then_crash  # type: ignore[assignment]
        try:
            for n in range(60):
                try:
                    await _turn(rt, ws, n, spec)
                except Crash:
                    run_id, k = where[0].split(":")
                    return int(run_id[1:]), int(k)
        finally:
            model_step._compact = real  # type: ignore[assignment]
        raise AssertionError("no step compacted")

    return asyncio.run(go())


def _retry(rt: Runtime, ws: Workspace, spec: dict[str, Any], n: int, k: int) -> None:
    """The same step again, as Temporal retries it."""
    inp = ModelStepInput(ids=_ids(n), step=k, workspace=str(ws.root), provider=spec, after_tools=k > 0)
    with contextlib.suppress(MakaError):
        asyncio.run(model_step.model_step(rt, inp))


def test_a_retried_step_reuses_the_committed_summary(
    rt: Runtime, ws: Workspace, vendor: WindowedVendor, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spec("openai")
    n, k = _crash_after_compaction(rt, ws, spec)
    step_id = f"r{n}:{k}"
    events = rt.ledger.events(session_id=SESSION)
    (fact,) = [f for f in map(compaction.CompactionFact.of, events) if f is not None and f.step_id == step_id]
    before = vendor.summaries
    _retry(rt, ws, spec, n, k)
    assert vendor.summaries == before, "the retry summarized again"
    sent = vendor.requests[-1].body["messages"]
    assert fact.summary in sent[0]["content"]
    events = rt.ledger.events(session_id=SESSION)
    assert sent == openai_messages(compaction.step_request(events, step_id) or [])
    assert compaction.check_compactions(events) == []


def test_negative_control_a_step_that_regenerates_diverges_from_the_ledger(
    rt: Runtime, ws: Workspace, vendor: WindowedVendor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broken variant: the retried step does not see the committed fact (its ledger read drops
    it), so it summarizes again: a second summary the ledger never committed, for the same step."""
    spec = _spec("openai")
    n, k = _crash_after_compaction(rt, ws, spec)
    step_id = f"r{n}:{k}"
    committed = compaction.compaction_id(step_id)
    before = vendor.summaries
    real_events = rt.ledger.events
    resident = rt.ledger.session_events  # the step's read: the session's resident events
    monkeypatch.setattr(
        rt.ledger, "session_events", lambda sid: [e for e in resident(sid) if e.id != committed]
    )
    _retry(rt, ws, spec, n, k)
    assert vendor.summaries == before + 1, "the regenerating step summarized again"
    (fact,) = [
        f
        for f in map(compaction.CompactionFact.of, real_events(session_id=SESSION))
        if f and f.step_id == step_id
    ]
    assert f"summary #{vendor.summaries}" not in fact.summary, (
        "a regenerated summary is not the committed one"
    )


# --- what a cut may cover ---------------------------------------------------------------------------


def test_a_cut_never_covers_an_unsettled_call_or_a_park_nor_splits_a_pair() -> None:
    def r(n: int) -> dict[str, str]:
        return lf.ids(run=f"run-{n}", inv=f"inv-{n}", turn=f"turn-{n}")

    done = [
        e
        for n in (1, 2)
        for e in (
            lf.user(f"turn {n}", id=f"u{n}", **r(n)),
            *lf.t1(f"c{n}", "write_file", {"path": f"{n}"}, **r(n)),
            lf.response(f"c{n}", "write_file", {"kind": "text", "text": "ok"}, **r(n)),
            lf.text(f"wrote {n}", id=f"m{n}", **r(n)),
            lf.terminal(id=f"end{n}", **r(n)),
        )
    ]
    # Run 3: dispatched, no outcome (unsettled); run 4 completes after it.
    unsettled = [lf.user("turn 3", id="u3", **r(3)), *lf.t1("c3", "bash", {"command": "x"}, **r(3))]
    later = [
        lf.user("turn 4", id="u4", **r(4)),
        lf.text("ok", id="m4", **r(4)),
        lf.terminal(id="end4", **r(4)),
    ]
    events = done + unsettled + later
    ids = RunIds(session_id=lf.SESSION, turn_id="turn-5", run_id="run-5", invocation_id="inv-5")
    plan = compaction.plan_compaction(
        ids,
        "run-5:0",
        events,
        compaction.history_view(events),
        target=0,
        trigger="budget",
        estimate=0,
        budget=0,
    )
    assert plan is not None
    assert {e.run_id for e in plan.covered} == {"run-1", "run-2"}, [e.id for e in plan.covered]
    assert plan.tail[0].id == "u3"  # the unsettled run stays verbatim, from its user message on

    # A cut between a call and its response is never offered.
    history = compaction.history_view(done).history
    cuts = compaction.safe_cuts(history, 0, len(history))
    calls = [i for i, e in enumerate(history) if e.content is not None and e.content.kind == "function_call"]
    assert cuts and not {i + 1 for i in calls} & set(cuts)

    # A park pins its run until a later turn completes.
    parked = [
        lf.user("turn 3", id="u3", **r(3)),
        lf.event("end3", role="system", author="system", status="failed",
                 content=lf.ErrorContent(message="parked", code="max_steps_exceeded"),
                 actions=lf.Actions(end_invocation=True, state_delta={"failureClass": "parked",
                                                                      "parkReason": "max_steps_exceeded"}),
                 **r(3)),
    ]  # fmt: skip
    ids6 = ids.model_copy(update={"run_id": "run-6"})
    events = done + parked + [lf.user("turn 4", id="u4", **r(4))]
    plan = compaction.plan_compaction(
        ids6,
        "run-6:0",
        events,
        compaction.history_view(events),
        target=0,
        trigger="budget",
        estimate=0,
        budget=0,
    )
    assert plan is not None and {e.run_id for e in plan.covered} == {"run-1", "run-2"}
    events = done + parked + later
    plan = compaction.plan_compaction(
        ids6,
        "run-6:0",
        events,
        compaction.history_view(events),
        target=0,
        trigger="budget",
        estimate=0,
        budget=0,
    )
    assert plan is not None and "run-3" in {e.run_id for e in plan.covered}


@ONE_BACKEND
def test_the_planner_decides_the_same_with_and_without_compaction_facts(
    rt: Runtime, ws: Workspace, vendor: WindowedVendor
) -> None:
    """Maka's Phase 0 plan and provider replay skip hidden events: a compaction fact changes no
    decision, no replayed item and no replayed event of the continuation planner."""
    spec = _spec("openai")

    async def go() -> None:
        for n in range(30):
            await _turn(rt, ws, n, spec)

    asyncio.run(go())
    events = rt.ledger.events(session_id=SESSION)
    facts = {e.id for e in events if compaction.CompactionFact.of(e) is not None}
    assert facts
    for run_id in sorted({e.run_id for e in events}):
        run = [e for e in events if e.run_id == run_id]
        bare = [e for e in run if e.id not in facts]
        with_facts, without = plan_resume(run), plan_resume(bare)
        assert (with_facts.kind, with_facts.rejection_reasons, with_facts.operations) == (
            without.kind, without.rejection_reasons, without.operations,
        )  # fmt: skip
        assert [i for i in with_facts.replay_event_ids if i not in facts] == list(without.replay_event_ids)
        replay, replay_bare = replay_segment(read_prefix(run)), replay_segment(read_prefix(bare))
        assert (replay.block, replay.items, replay.replay_events) == (
            replay_bare.block, replay_bare.items, replay_bare.replay_events,
        )  # fmt: skip


@ONE_BACKEND
def test_the_audit_check_catches_a_compaction_fact_the_ledger_does_not_bear_out(
    rt: Runtime, ws: Workspace, vendor: WindowedVendor
) -> None:
    """Each fact is re-derived from the events before it; a fact naming another prefix (a digest, a
    range, a high-water that is not the history's, or a cut inside a call pair) is reported."""
    spec = _spec("openai")

    async def go() -> None:
        for n in range(20):
            await _turn(rt, ws, n, spec)

    asyncio.run(go())
    events = rt.ledger.events(session_id=SESSION)
    assert compaction.check_compactions(events) == []
    at = next(i for i, e in enumerate(events) if compaction.CompactionFact.of(e) is not None)
    fact = events[at]
    delta = dict(fact.actions.state_delta[compaction.COMPACTION_KEY])  # type: ignore[index,union-attr]
    history = compaction.history_view(events[:at]).history
    end = next(i for i, e in enumerate(history) if e.id == delta["lastEventId"])
    inside_pair = next(
        i
        for i in range(end - 1, 0, -1)
        if history[i].content is not None and history[i].content.kind == "function_call"
    )
    tampered = {
        "coveredDigest": {"coveredDigest": "sha256:" + "0" * 64},
        "highWater": {"highWater": delta["highWater"] + 1},
        "range": {"lastEventId": history[end - 4].id},
        "pair": {
            "lastEventId": history[inside_pair].id,
            "coveredEvents": inside_pair + 1,
            "coveredDigest": compaction.covered_digest(history[: inside_pair + 1]),
        },
    }
    for what, change in tampered.items():
        bad = fact.model_copy(
            update={
                "actions": fact.actions.model_copy(  # type: ignore[union-attr]
                    update={"state_delta": {compaction.COMPACTION_KEY: {**delta, **change}}}
                )
            }
        )
        problems = compaction.check_compactions([*events[:at], bad, *events[at + 1 :]])
        assert [p for p, _ in problems][:1] == [fact.id], (what, problems)


def test_the_summarizer_reads_at_most_a_bounded_slice_of_one_huge_event() -> None:
    """A tool result larger than the window is elided in the middle, so the compaction's own
    request still fits; the tail, never rewritten, keeps what it keeps."""
    big = "x" * 50_000
    events = [
        lf.user("turn 1", id="u1"),
        *lf.t1("c1", "read_file", {"path": "big"}),
        lf.response("c1", "read_file", {"kind": "text", "text": big}),
    ]
    text = compaction.transcript(compaction.history_view(events).history)
    assert "characters elided" in text and len(text) < 2 * compaction.MAX_TRANSCRIPT_EVENT


# --- choosing the cut: linear, and the same cut as before ------------------------------------------


def _old_estimate(events: list[Any]) -> int:
    """``estimate_tokens`` as it was: every event serialized at every call (no size kept per event)."""
    wire = [canonical_json.dumps(e.content.to_wire()) for e in events if e.content is not None]
    size = sum(len(line.encode("utf-8")) + 8 for line in wire)
    return -(-size // compaction.BYTES_PER_TOKEN)


def _old_cut(history: list[Any], cuts: list[int], target: int) -> int:
    """The cut as it was chosen before: the tail re-serialized for every candidate (quadratic)."""
    return next((c for c in cuts if _old_estimate(history[c:]) <= target), cuts[-1])


def _generated_history(rng: random.Random, n: int) -> list[Any]:
    events: list[Any] = []
    for i in range(n):
        pick = rng.random()
        if pick < 0.3:
            events.extend(lf.t1(f"c{i}", "write_file", {"path": "x" * rng.randrange(40)}))
            result = {"kind": "text", "text": "y" * rng.randrange(300)}
            events.append(lf.response(f"c{i}", "write_file", result))
        elif pick < 0.6:
            events.append(lf.user("u" * rng.randrange(500), id=f"u{i}"))
        else:
            events.append(lf.text("é" * rng.randrange(500), id=f"m{i}"))
    return compaction.history_view(events).history


def test_the_cut_is_the_one_the_quadratic_scan_chose() -> None:
    """Pinned against the old expression, on seeded histories and every target that matters."""
    rng = random.Random(20261201)
    compared = 0
    for _ in range(40):
        history = _generated_history(rng, rng.randrange(1, 40))
        cuts = compaction.safe_cuts(history, 0, len(history))
        if not cuts:
            continue
        whole = compaction.estimate_tokens(history)
        for target in {0, 1, whole // 4, whole // 2, whole - 1, whole, whole + 1, rng.randrange(whole + 2)}:
            assert compaction.choose_cut(history, cuts, target) == _old_cut(history, cuts, target)
            compared += 1
    assert compared > 100


def test_choosing_the_cut_serializes_each_event_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted, not timed: ``canonical_json.dumps`` calls while planning grow with the history,
    not with its square. Negative control: the old scan on the same history makes quadratically many."""
    real = canonical_json.dumps
    calls = [0]

    def counting(value: Any) -> str:
        calls[0] += 1
        return real(value)

    monkeypatch.setattr(canonical_json, "dumps", counting)
    history = [lf.user(f"turn {i} " + "p" * 200, id=f"u{i}") for i in range(400)]
    cuts = compaction.safe_cuts(history, 0, len(history) - 1)
    target = compaction.estimate_tokens(history[-3:])  # the cut falls near the end
    calls[0] = 0
    new = compaction.choose_cut(history, cuts, target)
    linear = calls[0]
    calls[0] = 0
    old = _old_cut(history, cuts, target)
    quadratic = calls[0]
    print(f"dumps calls for a 400-event history: {linear} (suffix sums), {quadratic} (old scan)")
    assert new == old
    assert linear <= len(history), linear
    assert quadratic > 50 * len(history), "the control: the old scan re-serializes each tail"
    # The whole plan stays linear too (the digest and the transcript serialize each event once more).
    ids = RunIds(session_id=lf.SESSION, turn_id="t", run_id="r", invocation_id="i")
    calls[0] = 0
    plan = compaction.plan_compaction(
        ids, "r:0", history, compaction.history_view(history),
        target=target, trigger="budget", estimate=0, budget=0,
    )  # fmt: skip
    assert plan is not None and calls[0] <= 3 * len(history), calls[0]


# --- the caps count the compaction's call ----------------------------------------------------------


class _Planned(Exception):
    pass


@pytest.mark.parametrize("variant", ["fixed", "control"])
def test_a_cap_the_compaction_would_pass_parks_the_step_before_its_own_call(
    rt: Runtime, ws: Workspace, vendor: WindowedVendor, monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    """The session runs uncapped until a step first plans a compaction; it stops there (nothing of
    it committed) and the cap is set to admit that step's own call as the old check foresaw it
    (used + last + 1), not the compaction's call on top. Fixed: the check before counts the
    compaction request, and the check after the fact commits counts its usage; either parks the
    step before its own call. Control (today: one check, the compaction not counted): it is sent."""
    spec = _spec("openai")
    if variant != "fixed":
        monkeypatch.setattr(model_step, "_compaction_cost", lambda plan: 0)
    if variant == "control":
        monkeypatch.setattr(model_step, "_check_usage_after_compaction", lambda *a: None)
    real_plan = model_step._plan
    stopped: list[str] = []

    def plan_once(*args: Any, **kwargs: Any) -> Any:
        plan = real_plan(*args, **kwargs)
        if plan is not None and not stopped:
            stopped.append(args[2])
            raise _Planned
        return plan

    monkeypatch.setattr(model_step, "_plan", plan_once)

    async def go() -> None:
        n = 0
        while not stopped:
            with contextlib.suppress(_Planned):
                await _turn(rt, ws, n, spec)
            n += 1
        events = rt.ledger.events(session_id=SESSION)
        spent = [step_tokens(e.actions.token_usage) for e in events if e.actions and e.actions.token_usage]
        policy = parse_policy({"usage": {"maxTokensPerSession": sum(spent) + spent[-1] + 1}})
        # A session's policy is recorded once, before its first turn, and the cap needs the
        # session's usage up to this step: the runtime's cached governance is swapped for it.
        rt._governance[SESSION] = SessionGovernance(policy)
        vendor.requests.clear()
        ids, k = _ids(n - 1), int(stopped[0].rsplit(":", 1)[1])
        inp = ModelStepInput(ids=ids, step=k, workspace=str(ws.root), provider=spec, after_tools=k > 0)
        await model_step.model_step(rt, inp)

    if variant == "control":
        asyncio.run(go())
        assert any(r.body.get("tools") for r in vendor.requests), "the step's own call was sent"
        return
    with pytest.raises(UsageLimitReached) as err:
        asyncio.run(go())
    assert err.value.code == "usage_limit_reached" and err.value.detail["stepId"] == stopped[0]
    assert not any(r.body.get("tools") for r in vendor.requests), "the step's own call must not be sent"
    facts = [f for f in map(compaction.CompactionFact.of, rt.ledger.events(session_id=SESSION)) if f]
    assert len(facts) == (0 if variant == "fixed" else 1), facts


class _DearSummaries(WindowedVendor):
    """A vendor whose summaries cost more than maka's estimate foresees (it bills a summary's input
    at ``factor`` times its own count; 12: about nine times maka's estimate): only the check after
    the compaction commits, from the usage the vendor reported, sees the step's call would pass the cap."""

    factor = 12.0

    def answer(self, anthropic: bool, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        status, reply = super().answer(anthropic, body)
        if status == 200 and not body.get("tools"):
            reply["usage"]["prompt_tokens"] = int(reply["usage"]["prompt_tokens"] * self.factor)
            reply["usage"]["total_tokens"] = (
                reply["usage"]["prompt_tokens"] + reply["usage"]["completion_tokens"]
            )
        return status, reply


def _last_usage_tokens(events: list[Any], sent: Any = None) -> int:
    """The estimate before the fix: the last event with usage, a compaction's included."""
    return [step_tokens(e.actions.token_usage) for e in events if e.actions and e.actions.token_usage][-1]


@pytest.mark.parametrize(
    ("variant", "factor"), [("fixed", 12.0), ("control", 12.0), ("fixed", 2.5), ("summary_as_last", 2.5)]
)
def test_the_check_after_the_compaction_commits_parks_a_step_its_summary_made_too_dear(
    rt: Runtime, ws: Workspace, monkeypatch: pytest.MonkeyPatch, variant: str, factor: float
) -> None:
    """The cap admits the step exactly as the check before foresees it (used + the compaction's
    estimate + last), so that check passes; the vendor then reports the summary at more than the
    estimate. Fixed: the check after the fact commits parks the step before its own call. Controls:
    that second check removed (the first kept), or (at 2.5 times) the second check estimating the
    step's call at the compaction's own usage, the last usage committed: the call is sent past the cap."""
    vendor = _DearSummaries(WINDOW)
    vendor.factor = factor
    monkeypatch.setenv("OPENAI_BASE_URL", vendor.url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    spec = _spec("openai")
    if variant == "control":
        monkeypatch.setattr(model_step, "_check_usage_after_compaction", lambda *a: None)
    if variant == "summary_as_last":
        monkeypatch.setattr(model_step, "next_call_tokens", _last_usage_tokens)
    real_plan = model_step._plan
    stopped: list[tuple[str, int]] = []

    def plan_once(*args: Any, **kwargs: Any) -> Any:
        plan = real_plan(*args, **kwargs)
        if plan is not None and not stopped:
            stopped.append((args[2], model_step._compaction_cost(plan)))
            raise _Planned
        return plan

    monkeypatch.setattr(model_step, "_plan", plan_once)

    async def go() -> None:
        n = 0
        while not stopped:
            with contextlib.suppress(_Planned):
                await _turn(rt, ws, n, spec)
            n += 1
        events = rt.ledger.events(session_id=SESSION)
        spent = [step_tokens(e.actions.token_usage) for e in events if e.actions and e.actions.token_usage]
        step_id, estimate = stopped[0]
        cap = sum(spent) + estimate + spent[-1]  # the check before admits it: not > cap
        rt._governance[SESSION] = SessionGovernance(parse_policy({"usage": {"maxTokensPerSession": cap}}))
        vendor.requests.clear()
        ids, k = _ids(n - 1), int(step_id.rsplit(":", 1)[1])
        inp = ModelStepInput(ids=ids, step=k, workspace=str(ws.root), provider=spec, after_tools=k > 0)
        await model_step.model_step(rt, inp)

    try:
        if variant != "fixed":
            asyncio.run(go())
            assert any(r.body.get("tools") for r in vendor.requests), "the step's own call was sent"
            spent = [step_tokens(e.actions.token_usage) for e in rt.ledger.events(session_id=SESSION)
                     if e.actions and e.actions.token_usage]  # fmt: skip
            assert sum(spent) > rt.session_governance(SESSION).policy.usage.max_tokens_per_session  # type: ignore[union-attr,operator]
            return
        with pytest.raises(UsageLimitReached) as err:
            asyncio.run(go())
    finally:
        vendor.close()
    assert err.value.detail["stepId"] == stopped[0][0]
    assert err.value.detail["used"] > err.value.detail["cap"] - err.value.detail["next"], err.value.detail
    assert [bool(r.body.get("tools")) for r in vendor.requests] == [False], "only the summary was asked"
    facts = [f for f in map(compaction.CompactionFact.of, rt.ledger.events(session_id=SESSION)) if f]
    assert len(facts) == 1, facts


# --- an operator's run is no later turn ------------------------------------------------------------


@pytest.mark.parametrize("variant", ["operator", "control"])
def test_a_limit_raise_does_not_unpin_the_park_it_answers(
    store: LedgerStore, rt: Runtime, ws: Workspace, variant: str
) -> None:
    """Turn 0 completes, turn 1 parks ``usage_limit_reached``, an operator raises the cap (a
    completed ``resolution-`` run): the park stays pinned, so no compaction may cover it. Control:
    the same run under a turn's id (a later turn that completed) unpins it, as it should."""
    spec = {"kind": "script", "steps": [{"text": "answer 0"}, {"text": "answer 1"}]}
    asyncio.run(_turn(rt, ws, 0, spec))
    asyncio.run(_turn(rt, ws, 1, spec, end=False))
    park = FinishRunInput(ids=_ids(1), status="failed", ts=1, park_reason="usage_limit_reached")
    asyncio.run(turn.finish_run(rt, park))
    store.put_session_policy(
        SESSION, **SessionGovernance(parse_policy({"usage": {"maxTokensPerSession": 100}})).to_record()
    )
    raise_limit(store, SESSION, caps={"maxTokensPerSession": 500}, raised_by="ops", reason="budget")
    events = store.events(session_id=SESSION)
    if variant == "control":
        events = [e.model_copy(update={"run_id": "r2"}) if is_resolution_run(e.run_id) else e for e in events]
    history = legal_replay(events)
    first_of_park = next(i for i, e in enumerate(history) if e.run_id == "r1")
    pinned = compaction.pinned_from(events, history)
    assert pinned == (first_of_park if variant == "operator" else len(history)), (pinned, first_of_park)
    assert compaction.check_compactions(events) == []
