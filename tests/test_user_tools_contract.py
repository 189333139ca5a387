"""The tool contract itself: ``@tool`` and ``FunctionTool`` declare a tool (or refuse it with
``tools_invalid`` naming it), and the runtime runs one through the same path as every built-in:
arguments checked by the model before T1, the result committed as JSON, a raising tool an error
result, a non-JSON result ``tool_result_invalid``, an async ``run`` awaited on the worker's loop."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from maka_core.runtime import recovery, tool_admission, tool_call
from maka_core.runtime.runtime import Runtime
from maka_core.store.writer import LedgerStore
from maka_core.tools import (
    FunctionTool,
    Reconciled,
    ToolContext,
    ToolRefusal,
    ToolsInvalid,
    idempotency_key,
    tool,
)
from maka_core.tools.registry import default_tools
from maka_core.workspace import Workspace
from tests.test_runtime import ATTEMPT, one_call, op_status, recover_input, run, tool_input


class Greet(BaseModel):
    who: str
    times: int = 1


class Blob:
    """A type no JSON schema describes."""


class Opaque(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    thing: Blob


SEEN: list[ToolContext] = []


@tool(guarantee="read-only")
def greet(args: Greet, ctx: ToolContext) -> str:
    """Say hello."""
    SEEN.append(ctx)
    return " ".join([f"hello {args.who}"] * args.times)


@tool(name="agreet", guarantee="read-only")
async def async_greet(args: Greet, ctx: ToolContext) -> dict[str, Any]:
    """Say hello, asynchronously."""
    await asyncio.sleep(0)
    return {"hello": args.who, "loop": asyncio.get_running_loop() is not None}


@tool(guarantee="read-only")
def explode(args: Greet, ctx: ToolContext) -> str:
    raise RuntimeError(f"no {args.who}")


@tool(guarantee="read-only")
def not_json(args: Greet, ctx: ToolContext) -> Any:
    return {"when": object()}


@tool(guarantee="read-only")
def huge(args: Greet, ctx: ToolContext) -> str:
    return args.who * (64 * 1024 + 1)


@tool(guarantee="read-only")
def refuse(args: Greet, ctx: ToolContext) -> str:
    raise ToolRefusal("no_such_customer", f"nobody called {args.who}")


def runtime_with(store: LedgerStore, *extra: FunctionTool) -> Runtime:
    return Runtime(store, tools={**default_tools(), **{t.name: t for t in extra}})


@pytest.fixture
def urt(tmp_path: Path) -> Any:
    store = LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    rt = runtime_with(store, greet, async_greet, explode, not_json, huge, refuse)
    yield rt
    rt.close()
    store.close()


def committed(rt: Runtime, event_id: str | None) -> tuple[dict[str, Any], bool]:
    event = next(e for e in rt.ledger.events(session_id="s1") if e.id == event_id)
    assert event.content is not None and event.content.kind == "function_response"
    return event.content.result, bool(event.content.is_error)  # type: ignore[return-value]


def test_decorator_declares_schema_description_and_guarantee() -> None:
    assert greet.name == "greet"
    assert greet.description == "Say hello."
    assert greet.parameters == Greet.model_json_schema()
    assert greet.guarantee == "read-only" and greet.effects == {"read"} and not greet.mutates
    assert greet.recovery_mode == "replay_safe"


def _send_email(args: Greet, ctx: ToolContext) -> str:
    """Send an email (a tool that forgot to say so)."""
    return "sent"


def test_a_tool_declaring_nothing_is_at_most_once_never_a_read() -> None:
    """``send_email`` with neither guarantee= nor effects= is never judged a read (which recovery
    runs again after a crash): it is at-most-once and mutates. ``effects=["read"]`` alone is a read."""
    undeclared = tool(_send_email)
    assert undeclared.guarantee == "at-most-once" and undeclared.effects == {"mutate"}
    assert undeclared.mutates and undeclared.recovery_mode != "replay_safe"
    read = tool(_send_email, name="peek", effects=["read"])
    assert read.guarantee == "read-only" and read.effects == {"read"} and not read.mutates


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"effects": ["mutate"]}, "must declare guarantee="),
        ({"guarantee": "read-only", "effects": ["destructive"]}, "cannot declare mutating"),
        ({"guarantee": "reconciliation-required"}, "needs a reconcile="),
        ({"guarantee": "sometimes"}, "guarantee must be one of"),
        ({"name": "has space"}, "a name is"),
    ],
)
def test_a_contradictory_declaration_is_tools_invalid_naming_the_tool(
    kwargs: dict[str, Any], words: str
) -> None:
    with pytest.raises(ToolsInvalid) as caught:
        tool(**kwargs)(greet.run_fn)
    assert caught.value.code == "tools_invalid"
    assert words in caught.value.message
    assert caught.value.detail["tool"] == kwargs.get("name", "greet")


def test_a_function_without_a_model_or_a_model_without_schema_is_refused() -> None:
    def untyped(args, ctx):  # type: ignore[no-untyped-def]
        return "x"

    with pytest.raises(ToolsInvalid, match="pydantic model"):
        tool(untyped)

    def opaque(args: Opaque, ctx: ToolContext) -> str:
        return "x"

    with pytest.raises(ToolsInvalid, match="no JSON schema"):
        tool(opaque)


def test_a_programmatic_tool_takes_a_raw_schema_and_its_validator() -> None:
    def check(args: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(args.get("q"), str):
            raise ValueError("q must be a string")
        return args

    raw = FunctionTool(
        name="mcp__srv__search",
        description="search",
        parameters={"type": "object", "properties": {"q": {"type": "string"}}},
        validate=check,
        guarantee="provider-idempotent",
        run=lambda args, ctx: {"q": args["q"], "key": ctx.idempotency_key},
    )
    assert raw.effects == {"mutate"} and raw.recovery_mode == "idempotent"
    with pytest.raises(ToolsInvalid, match="validate="):
        FunctionTool(name="x", parameters={"type": "object"}, run=lambda a, c: None)


def test_user_tools_run_through_the_tool_path(urt: Runtime, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    ref = one_call(urt, ws, "greet", {"who": "ada", "times": 2})
    outcome = run(tool_call.execute_tool(urt, tool_input(ws, ref), ATTEMPT))
    assert outcome.status == "completed" and not outcome.is_error
    assert committed(urt, outcome.response_event_id) == (
        {"kind": "text", "text": "hello ada hello ada"},
        False,
    )
    ctx = SEEN[-1]
    assert ctx.operation_id == ref.operation_id and ctx.session_id == "s1" and ctx.attempt == 1
    assert ctx.idempotency_key == idempotency_key("s1", ref.operation_id)
    assert ctx.workspace_root == ws.root


@pytest.mark.parametrize(
    ("name", "args", "code"),
    [
        ("greet", {"who": 3}, "tool_args_invalid"),
        ("explode", {"who": "x"}, "tool_failed"),
        ("not_json", {"who": "x"}, "tool_result_invalid"),
        ("huge", {"who": "x"}, "tool_result_too_large"),
        ("refuse", {"who": "x"}, "no_such_customer"),
    ],
)
def test_bad_arguments_a_raising_tool_and_a_non_json_result_are_committed_errors(
    urt: Runtime, tmp_path: Path, name: str, args: dict[str, Any], code: str
) -> None:
    ws = workspace(tmp_path)
    ref = one_call(urt, ws, name, args)
    outcome = run(tool_call.execute_tool(urt, tool_input(ws, ref), ATTEMPT))
    result, is_error = committed(urt, outcome.response_event_id)
    assert is_error and result["value"]["code"] == code, result
    # Arguments are refused before T1: no dispatch fact; a run that failed has one.
    assert (outcome.status == "refused") == (code == "tool_args_invalid")


def test_an_async_tool_is_awaited(urt: Runtime, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    ref = one_call(urt, ws, "agreet", {"who": "bo"})
    outcome = run(tool_call.execute_tool(urt, tool_input(ws, ref), ATTEMPT))
    assert committed(urt, outcome.response_event_id) == (
        {"kind": "json", "value": {"hello": "bo", "loop": True}},
        False,
    )


def workspace(tmp_path: Path) -> Workspace:
    (tmp_path / "ws").mkdir(exist_ok=True)
    return Workspace.open(tmp_path / "ws")


STOPPED: list[str] = []


@tool(guarantee="at-most-once")
def spin(args: Greet, ctx: ToolContext) -> str:
    """Work until cancelled, heartbeating."""
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            ctx.heartbeat()
            time.sleep(0.01)
    finally:
        STOPPED.append(f"spin {ctx.cancelled}")
    return "finished"


@tool(guarantee="at-most-once")
async def wait_long(args: Greet, ctx: ToolContext) -> str:
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        STOPPED.append("wait_long cancelled")
        raise
    return "finished"


@pytest.mark.parametrize(("name", "said"), [("spin", "spin True"), ("wait_long", "wait_long cancelled")])
def test_a_cancelled_attempt_stops_a_sync_or_async_tool_and_commits_no_outcome(
    tmp_path: Path, name: str, said: str
) -> None:
    store = LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    rt = runtime_with(store, spin, wait_long)
    ws = workspace(tmp_path)
    try:
        ref = one_call(rt, ws, name, {"who": "x"})

        async def go() -> None:
            call = asyncio.ensure_future(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
            deadline = time.monotonic() + 10
            while rt.ledger.decision(ref.operation_id) is None:  # T1 (with its decision) committed
                assert time.monotonic() < deadline, "T1 never committed"
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call

        run(go())
        deadline = time.monotonic() + 10
        while said not in STOPPED:
            assert time.monotonic() < deadline, f"the tool did not stop: {STOPPED}"
            time.sleep(0.01)
        assert op_status(rt, ref) == ("indeterminate", "dispatch_without_response")  # T1, never T2
    finally:
        rt.close()
        store.close()


async def _server_down(args: Greet, ctx: ToolContext) -> None:
    await asyncio.sleep(0)
    raise ToolRefusal("mcp_server_unavailable", "the server did not answer")


@tool(guarantee="at-most-once", preflight=_server_down)
def unreachable(args: Greet, ctx: ToolContext) -> str:
    raise AssertionError("never runs: preflight refused")


async def _evidence(args: Greet, ctx: ToolContext) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"schema": "tests.greeting/v1", "who": args.who}


async def _reconcile(args: Greet, evidence: Any, ctx: ToolContext) -> Reconciled:
    await asyncio.sleep(0)
    return Reconciled.done({"greeted": evidence["who"]}, {"who": evidence["who"]})


@tool(guarantee="reconciliation-required", evidence=_evidence, reconcile=_reconcile)
def greet_once(args: Greet, ctx: ToolContext) -> dict[str, Any]:
    return {"greeted": args.who}


def test_an_async_preflight_refuses_before_t1(tmp_path: Path) -> None:
    store = LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    rt = runtime_with(store, unreachable)
    ws = workspace(tmp_path)
    try:
        ref = one_call(rt, ws, "unreachable", {"who": "x"})
        outcome = run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
        result, is_error = committed(rt, outcome.response_event_id)
        assert outcome.status == "refused" and is_error
        assert result["value"]["code"] == "mcp_server_unavailable"
        assert rt.ledger.decision(ref.operation_id) is None or outcome.dispatch_event_id is None  # no T1
    finally:
        rt.close()
        store.close()


def test_async_evidence_and_reconcile_settle_a_call_after_a_crash(tmp_path: Path) -> None:
    store = LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    rt = runtime_with(store, greet_once)
    ws = workspace(tmp_path)
    try:
        ref = one_call(rt, ws, "greet_once", {"who": "ada"})
        # T1 with the evidence; then a crash
        admitted = tool_admission.admit_call(rt, tool_input(ws, ref), ATTEMPT)
        assert isinstance(admitted, tool_admission.Dispatched)
        assert rt.ledger.evidence(ref.operation_id) == {"schema": "tests.greeting/v1", "who": "ada"}
        result = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
        assert (result.status, result.reason) == ("completed", "reconcile_matches_expected_state")
        assert committed(rt, result.response_event_id) == (
            {"kind": "json", "value": {"greeted": "ada"}},
            False,
        )
    finally:
        rt.close()
        store.close()


# --- an async hook run before T1 is bounded: the ledger's thread waits for it ---------------------


async def _hangs(args: Greet, ctx: ToolContext) -> None:
    await asyncio.sleep(2.5)  # a server that answers late (far later than the tool's bound)


async def _hanging_evidence(args: Greet, ctx: ToolContext) -> dict[str, Any]:
    await asyncio.sleep(2.5)
    return {"schema": "tests.greeting/v1", "who": args.who}


def _bounded(hook: str, timeout_s: float) -> Any:
    def body(args: Greet, ctx: ToolContext) -> str:
        return "ran"

    hooks: dict[str, Any] = {"preflight": _hangs} if hook == "preflight" else {"evidence": _hanging_evidence}
    if hook == "evidence":
        hooks["reconcile"] = _reconcile
    guarantee = "at-most-once" if hook == "preflight" else "reconciliation-required"
    return tool(body, name=f"slow_{hook}", guarantee=guarantee, hook_timeout_s=timeout_s, **hooks)


@pytest.mark.parametrize("hook", ["preflight", "evidence"])
@pytest.mark.parametrize("timeout_s", [0.3, 60.0], ids=["bounded", "negative-control-unbounded"])
def test_a_hung_async_hook_before_t1_is_cut_off_and_refused_without_t1(
    tmp_path: Path, hook: str, timeout_s: float
) -> None:
    store = LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    slow = _bounded(hook, timeout_s)
    rt = runtime_with(store, slow)
    ws = workspace(tmp_path)
    try:
        ref = one_call(rt, ws, slow.name, {"who": "x"})

        async def go() -> tuple[bool, Any]:
            call = asyncio.ensure_future(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
            await asyncio.wait({call}, timeout=1.5)
            done_early = call.done()
            return done_early, await call

        done_early, outcome = run(go())
        if timeout_s < 1:
            assert done_early, "the hook held the ledger's thread past its bound"
            result, is_error = committed(rt, outcome.response_event_id)
            assert outcome.status == "refused" and is_error
            assert result["value"]["code"] == "tool_hook_timeout", result
            assert outcome.dispatch_event_id is None and rt.ledger.evidence(ref.operation_id) is None  # no T1
        else:  # today's behaviour: the ledger's thread waited the hook out, and the call then ran
            assert not done_early
            assert outcome.status == "completed"
    finally:
        rt.close()
        store.close()


def test_a_hook_timeout_must_be_positive() -> None:
    def body(args: Greet, ctx: ToolContext) -> str:
        return "x"

    with pytest.raises(ToolsInvalid, match="hook_timeout_s"):
        tool(body, name="t", guarantee="read-only", hook_timeout_s=0)
    assert tool(body, name="t", guarantee="read-only", hook_timeout_s=0.1).hook_timeout_s == 0.1


# --- one narrowing order for every guarantee ------------------------------------------------------


def test_a_policy_and_an_mcp_servers_file_narrow_by_one_order() -> None:
    """``governance.guarantee.narrowed`` (a policy's ``toolGuarantees``) and the servers file's
    ``narrower`` agree on every pair of guarantees an MCP tool can have. Before, the policy ranked
    ``provider-idempotent`` and ``at-least-once`` alike and ignored that narrowing (it answered
    ``provider-idempotent`` below, the servers file ``at-least-once``)."""
    from maka_core.governance.guarantee import narrowed
    from maka_core.tools.mcp.guarantee import narrower

    mcp = ("read-only", "provider-idempotent", "at-least-once", "at-most-once")
    for declared in mcp:
        for asked in mcp:
            assert narrowed(declared, asked) == narrower(declared, asked), (declared, asked)  # type: ignore[arg-type]
    assert narrowed("provider-idempotent", "at-least-once") == "at-least-once"
    assert narrowed("at-least-once", "provider-idempotent") == "at-least-once"  # never widened
