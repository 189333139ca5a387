"""A vendor's token counts are data to check (issue 37 item 6), on real sessions.

The dev server, an in-process worker (the same ``serve`` as ``maka worker``), the real ``openai``
and ``anthropic`` SDKs against local servers speaking chat completions and Messages. The session's
policy caps a turn at 1,000 tokens; every answer of the hostile vendor really costs 600 (the test's
own account of the vendor's bill) and reports a lie: a negative count, a count too large for any
JSON number, a fraction, or (a variant of our own) a ``total`` below its parts. The vendor answers
five tool calls and then a text, six requests in all.

- Checked: the first answer is refused ``usage_invalid`` (not retried: one request) and nothing of
  it commits; the turn fails with the code; the vendor billed 600, under the cap. The short total
  is counted as its parts (600), so the turn parks ``usage_limit_reached`` before the second call.
- Negative control, the unchecked path of ``1016e42`` put back by the test (counts committed as
  given, a count the ledger cannot hold dropped with a log line, a step's tokens its ``total``): the
  vendor gets all six requests, 3,600 tokens under the 1,000 cap, and the negative count leaves the
  session's usage negative.

A variant of our own: a lie in a step that rides in its call's tool activity (refused there, then
run again by the workflow as its own step): the worker remembers the refusal and the vendor is not
asked again; negative control, the refusal forgotten, a third request passes the cap.

Unit checks beside them: the bound, a non-integer, a missing count, the scripted provider's bound.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from maka_core.errors import ConfigError
from maka_core.facts.usage import MAX_STEP_COUNT, count_problem, step_tokens, usage_problem
from maka_core.governance import parse_policy
from maka_core.providers import ModelOutput, ProviderError, ScriptedProvider, anthropic_messages
from maka_core.runtime import builders, model_calls, model_step, step_output, usage_limits
from maka_core.runtime.contracts import RunIds
from maka_core.runtime.runtime import Runtime
from maka_core.runtime.session_view import session_view, transcript_lines
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.client.session_client import start_session
from tests.anthropic_server import MessagesServer, message, text, tool_use
from tests.temporal_support import in_process_worker, run_maka, wait_turn
from tests.test_providers import ChatServer, completion
from tests.test_usage_limits import _record_policy

CAP = 1000
#: What each answer really costs: the vendor's bill, which its reported usage lies about.
REAL = 600
CALL_STEPS = 5

#: variant -> (the chat-completions usage, the Messages usage or None: the variant is OpenAI's only).
LIES: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {
    "negative": (
        {"prompt_tokens": -1_000_000, "completion_tokens": 10, "total_tokens": -999_990},
        {"input_tokens": -1_000_000, "output_tokens": 10},
    ),
    "huge": (
        {"prompt_tokens": 10**30, "completion_tokens": 10, "total_tokens": 10**30 + 10},
        {"input_tokens": 10**30, "output_tokens": 10},
    ),
    "fraction": (
        {"prompt_tokens": 0.5, "completion_tokens": 0.25, "total_tokens": 0.75},
        {"input_tokens": 0.5, "output_tokens": 0.25},
    ),
    "short_total": ({"prompt_tokens": 590, "completion_tokens": 10, "total_tokens": 1}, None),
}
CASES = [
    (vendor, lie) for lie in LIES for vendor in ("openai", "anthropic") if vendor == "openai" or LIES[lie][1]
]


@pytest.fixture
def chat() -> Iterator[ChatServer]:
    server = ChatServer()
    yield server
    server.httpd.shutdown()


@pytest.fixture
def claude() -> Iterator[MessagesServer]:
    server = MessagesServer()
    yield server
    server.close()


def _script(vendor: str, lie: str, chat: ChatServer, claude: MessagesServer) -> None:
    """Five read_file calls and a text, every answer reporting the lie."""
    openai_usage, anthropic_usage = LIES[lie]
    args = {"path": "a.txt"}
    for k in range(CALL_STEPS + 1):
        if vendor == "openai":
            call = {"id": f"call_{k}", "type": "function",
                    "function": {"name": "read_file", "arguments": json.dumps(args)}}  # fmt: skip
            body = (
                completion({"content": None, "tool_calls": [call]}, "tool_calls")
                if k < CALL_STEPS
                else completion({"content": "done"})
            )
            body["usage"] = openai_usage
            chat.reply(200, body)
        else:
            assert anthropic_usage is not None
            reply = (
                message(tool_use(f"toolu_{k}", "read_file", args), stop="tool_use", usage=anthropic_usage)
                if k < CALL_STEPS
                else message(text("done"), usage=anthropic_usage)
            )
            claude.reply(reply)


def _unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The usage path of ``1016e42``, put back: counts committed as the vendor gave them (a shape the
    ledger refuses dropped with a log line, the step committed without it), a step's tokens its
    ``total`` (else input plus output)."""

    def committed_as_given(rt: Runtime, ids: RunIds, step_id: str, output: ModelOutput) -> Any:
        if output.usage is None:
            return None
        try:
            builders.step_usage(ids, step_id, dict(output.usage), 0)
        except ValueError:
            logging.getLogger(__name__).warning("step %s: usage not recorded", step_id)
            return None
        return dict(output.usage)

    def old_step_tokens(usage: Any) -> int:
        def count(key: str) -> int:
            value = usage.get(key)
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            return int(value) if ok else 0

        return count("total") or count("input") + count("output")

    monkeypatch.setattr(model_step, "_checked_usage", committed_as_given)
    monkeypatch.setattr(model_step, "step_tokens", old_step_tokens)
    monkeypatch.setattr(usage_limits, "step_tokens", old_step_tokens)
    monkeypatch.setattr(anthropic_messages, "count_problem", lambda value: None)


@pytest.mark.temporal
@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("checked", [True, False], ids=["checked", "unchecked_1016e42"])
@pytest.mark.parametrize(("vendor", "lie"), CASES)
async def test_a_vendors_lying_usage_never_buys_tokens_past_the_cap(
    temporal_client: Client,
    tmp_path: Path,
    ws_dir: Path,
    task_queue: str,
    chat: ChatServer,
    claude: MessagesServer,
    monkeypatch: pytest.MonkeyPatch,
    vendor: str,
    lie: str,
    checked: bool,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", chat.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", claude.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    if not checked:
        _unchecked(monkeypatch)
    (ws_dir / "a.txt").write_text("alpha\n")
    db = tmp_path / "ledger.sqlite"
    session_id = f"lie-{tmp_path.name}"[-60:]
    _record_policy(db, session_id, parse_policy({"usage": {"maxTokensPerTurn": CAP}}))
    _script(vendor, lie, chat, claude)
    async with in_process_worker(temporal_client, db, task_queue):
        _, accepted = await start_session(
            temporal_client,
            workspace=ws_dir,
            provider={"kind": vendor, "model": "m"},
            task_queue=task_queue,
            message="read a.txt five times",
            session_id=session_id,
        )
        status = await wait_turn(temporal_client, session_id, accepted.run_id)
    requests = len(chat.requests) if vendor == "openai" else len(claude.requests)
    billed = REAL * requests
    store = LedgerStore.open(db)
    try:
        events = store.events(session_id=session_id)
        usage = session_view(store, session_id, workflow_id="wf").to_json()["usage"]
    finally:
        store.close()
    transcript = "\n".join(transcript_lines(events))
    print(f"{vendor} {lie} checked={checked}: {requests} requests, billed {billed}, usage {usage}")

    if not checked:
        # The old path: the lie is believed (or dropped), so the cap never binds.
        assert requests == CALL_STEPS + 1 and billed > CAP, (requests, status)
        assert status.state == "idle", status
        if lie == "negative":
            assert usage is not None and usage["input"] < 0, usage
        return

    assert requests == 1 and billed <= CAP, f"{requests} requests: the cap was passed"
    if lie == "short_total":
        # Counted as its parts (600): the next call (about 600 more) would pass the cap.
        assert (status.state, status.park_reason) == ("parked", "usage_limit_reached"), status
        assert usage == {"input": 590, "output": 10, "total": 1}
        return
    assert status.state == "failed", status
    assert usage is None, "nothing of the refused step committed"
    assert "usage_invalid" in transcript, transcript
    assert not any(e.content is not None and e.content.kind == "function_call" for e in events)
    env = {**os.environ, "MAKA_HOME": str(tmp_path / "home")}
    shown = run_maka("session", "show", session_id, "--db", str(db), env=env)
    assert shown.returncode == 0 and "usage_invalid" in shown.stdout, shown.stdout + shown.stderr


# --- the check itself ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (0, None),
        (MAX_STEP_COUNT, None),
        (MAX_STEP_COUNT + 1, "is over the bound of 1000000000"),
        (-1, "is negative"),
        (12.5, "is not an integer (a float)"),
        (12.0, "is not an integer (a float)"),
        ("12", "is not an integer (a str)"),
        (True, "is not an integer (a bool)"),
        (None, "is not an integer (a NoneType)"),
    ],
)
def test_a_count_is_an_integer_within_the_bound(value: Any, problem: str | None) -> None:
    assert count_problem(value) == problem


def test_a_usage_needs_its_input_and_output_and_checks_every_count() -> None:
    assert usage_problem({"input": 1, "output": 2, "rawFinishReason": "stop"}) is None
    assert usage_problem({"input": 1}) == ("output", "is missing")
    assert usage_problem({"input": 1, "output": 2, "cacheRead": -3}) == ("cacheRead", "is negative")
    with pytest.raises(ProviderError) as refused:
        step_output.checked_usage({"input": 1, "output": -2}, "r:0", caps=False)
    assert (refused.value.code, refused.value.retryable) == ("usage_invalid", False)
    assert refused.value.detail == {"field": "output", "stepId": "r:0"}
    # No usage at all: unknown, unless a cap is in force (a step no one can count cannot be held to it).
    assert step_output.checked_usage(None, "r:0", caps=False) is None
    with pytest.raises(ProviderError) as missing:
        step_output.checked_usage(None, "r:0", caps=True)
    assert missing.value.code == "usage_invalid" and missing.value.detail["field"] == "report"


def test_a_step_counts_the_larger_of_its_total_and_its_parts_and_never_below_zero() -> None:
    assert step_tokens({"input": 590, "output": 10, "total": 1}) == 600
    assert step_tokens({"input": 590, "output": 10, "total": 700}) == 700
    assert step_tokens({"input": 30, "output": 10}) == 40
    # A negative count committed before counts were checked lowers nothing.
    assert step_tokens({"input": -1_000_000, "output": 10, "total": -999_990}) == 10


@pytest.mark.parametrize(
    ("usage", "where"),
    [
        ({"input": MAX_STEP_COUNT + 1, "output": 0}, "steps[0].usage.input"),
        ({"input": 1, "output": 2.5}, "steps[0].usage.output"),
        ({"input": 30}, "steps[0].usage"),
    ],
)
def test_the_scripted_provider_holds_its_usage_to_the_same_bound(usage: dict[str, Any], where: str) -> None:
    with pytest.raises(ConfigError) as err:
        ScriptedProvider([{"text": "x", "usage": usage}])
    assert err.value.code == "script_invalid" and err.value.detail["where"] == where


# --- a lie in a step that rides with a tool call ----------------------------------------------------

#: Two steps pass this cap (1,200 billed), three do not.
RIDING_CAP = 1500


@pytest.mark.temporal
@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("remembered", [True, False], ids=["refusal_remembered", "asked_again"])
async def test_a_lie_in_a_step_riding_with_its_call_is_not_asked_for_again(
    temporal_client: Client,
    tmp_path: Path,
    ws_dir: Path,
    task_queue: str,
    chat: ChatServer,
    monkeypatch: pytest.MonkeyPatch,
    remembered: bool,
) -> None:
    """An honest step with a call, then a lying step: the second rides in the call's tool activity
    (``with_tool``), is refused there, and the workflow runs it again as a step of its own. The
    worker remembers the refusal (``ModelCalls.refuse``): the vendor is not asked again, two
    requests, 1,200 billed under a 1,500 cap. Negative control, the refusal forgotten: a third
    request, 1,800 billed past the cap (the refused answer was never counted)."""
    monkeypatch.setenv("OPENAI_BASE_URL", chat.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    if not remembered:
        monkeypatch.setattr(model_calls.ModelCalls, "refusal", lambda self, step_id: None)
    (ws_dir / "a.txt").write_text("alpha\n")
    db = tmp_path / "ledger.sqlite"
    session_id = f"ride-{tmp_path.name}"[-60:]
    _record_policy(db, session_id, parse_policy({"usage": {"maxTokensPerTurn": RIDING_CAP}}))
    honest = {"prompt_tokens": 590, "completion_tokens": 10, "total_tokens": 600}
    for usage in (honest, LIES["negative"][0], LIES["negative"][0]):
        call = {
            "id": "call_r",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'},
        }
        body = completion({"content": None, "tool_calls": [call]}, "tool_calls")
        body["usage"] = usage
        chat.reply(200, body)
    async with in_process_worker(temporal_client, db, task_queue):
        _, accepted = await start_session(
            temporal_client,
            workspace=ws_dir,
            provider={"kind": "openai", "model": "m"},
            task_queue=task_queue,
            message="read a.txt",
            session_id=session_id,
        )
        status = await wait_turn(temporal_client, session_id, accepted.run_id)
    billed = REAL * len(chat.requests)
    print(f"remembered={remembered}: {len(chat.requests)} requests, billed {billed}, {status.state}")
    assert status.state == "failed", status
    if remembered:
        assert len(chat.requests) == 2 and billed <= RIDING_CAP
    else:
        assert len(chat.requests) == 3 and billed > RIDING_CAP
