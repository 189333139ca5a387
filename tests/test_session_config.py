"""One session configuration: what a session is started with, every new execution runs with.

- The pin (issue 19): a session started from the real CLI with non-default settings (step mode,
  step limit, continue-as-new thresholds, step timeout, system prompt, temperature, max tokens) on
  a local OpenAI-compatible server; its worker is SIGKILLed at P7 and the execution terminated;
  ``maka resume`` continues it in a new execution, then (that one terminated too) ``session send``
  reopens it. Each new execution's ``SessionInput`` holds the settings, and the vendor sees the
  system prompt, temperature and max tokens in every request. Negative control: the record as
  the writer before ``SessionConfig`` wrote it (provider and host only) decodes with the defaults,
  so a new execution built from it fails the same assertion.
- Anthropic: ``--system @FILE`` and ``--max-tokens`` reach the Messages request (``system``, never
  a message); ``--temperature`` is refused (the SDK's Messages API takes none).
- Refusals: bad values are refused with a stable code before anything is written.
- Histories: a flat input recorded before ``SessionConfig`` decodes into it and encodes back to
  the same keys.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from click.testing import CliRunner, Result
from pydantic.alias_generators import to_camel
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from maka_core.errors import MakaError
from maka_core.runtime.lost_run import SESSION_KEY, SessionRecord, session_record
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.cli.app import maka
from maka_temporal.workers.client.session_client import send_message
from maka_temporal.workers.host.devserver import free_port
from maka_temporal.workflows.contracts import MODEL_STEP, SessionConfig, SessionInput, workflow_id_for
from tests.anthropic_server import MessagesServer, message, text
from tests.temporal_support import WorkerProcess, in_process_worker, run_maka, start, wait_turn, write_script
from tests.test_providers import ChatServer, completion

SYSTEM = "You are the release bot. Answer in one line.\n"
#: The settings of the pinned session, as its SessionInput must hold them (all non-default).
EXPECTED = {
    "model_step_mode": "local",
    "max_steps_per_turn": 9,
    "continue_as_new_after_turns": 5,
    "continue_as_new_after_steps": 8,
    "model_step_timeout_s": 45.0,
    "tool_mode": "hybrid",  # not the default a record without one reads (the negative control)
}
MODEL_PARAMS = {"system": SYSTEM, "temperature": 0.25, "max_tokens": 77}


def _settings(config: SessionConfig) -> dict[str, Any]:
    return {k: getattr(config, k) for k in EXPECTED}


async def _inputs(client: Client, session_id: str) -> list[SessionInput]:
    """The input of every execution of the session's workflow id, oldest first."""
    out: list[tuple[Any, SessionInput]] = []
    async for execution in client.list_workflows(f"WorkflowId = '{workflow_id_for(session_id)}'"):
        history = await client.get_workflow_handle(execution.id, run_id=execution.run_id).fetch_history()
        started = json.loads(history.to_json())["events"][0]["workflowExecutionStartedEventAttributes"]
        (payload,) = started["input"]["payloads"]
        raw = json.loads(base64.b64decode(payload["data"]))
        out.append((execution.start_time, SessionInput.model_validate(raw)))
    return [inp for _, inp in sorted(out, key=lambda pair: pair[0])]


def _record(db: Path, session_id: str) -> tuple[SessionRecord | None, dict[str, Any]]:
    store = LedgerStore.open(f"sqlite:///{db}")
    try:
        events = store.events(session_id=session_id)
    finally:
        store.close()
    raw = next(
        e.actions.state_delta[SESSION_KEY]
        for e in events
        if e.actions is not None and e.actions.state_delta and SESSION_KEY in e.actions.state_delta
    )
    return session_record(events), raw


def _model_params(body: dict[str, Any]) -> dict[str, Any]:
    first = body["messages"][0]
    return {
        "system": first["content"] if first["role"] == "system" else None,
        "temperature": body.get("temperature"),
        "max_tokens": body.get("max_completion_tokens"),
    }


#: The host and host wait the pinned session is started with (and its workers serve).
HOST, HOST_WAIT = "cfg-host", "77"


@dataclass(frozen=True)
class Drill:
    """What the pinned session left: every execution's input, the vendor's requests, the final
    ``session status --json``, the ledger's session record (decoded and raw), the policy digest."""

    inputs: list[SessionInput]
    requests: list[dict[str, Any]]
    status: dict[str, Any]
    record: SessionRecord | None
    raw: dict[str, Any]
    policy_digest: str


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def drill(
    temporal_server: Any, temporal_client: Client, tmp_path_factory: pytest.TempPathFactory
) -> Drill:
    """Start (CLI), SIGKILL at P7 and terminate, ``maka resume``, terminate, ``session send``:
    three executions of one session, run once for every test of this module that reads them."""
    tmp_path = tmp_path_factory.mktemp("config-drill")
    ws_dir = tmp_path / "ws"
    ws_dir.mkdir()
    home = tmp_path / "home"
    db = home / "ledger.sqlite"
    queue = f"config-{tmp_path.name}"[:60]
    chat = ChatServer()
    vendor = {"OPENAI_BASE_URL": chat.url, "OPENAI_API_KEY": "sk-local", "MAKA_HOST": HOST}
    env = {
        **os.environ,
        "MAKA_HOME": str(home),
        "MAKA_DB": str(db),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "MAKA_TASK_QUEUE": queue,
        "MAKA_HOST": HOST,
        "MAKA_HOST_WAIT": HOST_WAIT,
    }
    for key in ("MAKA_FAILPOINT", "MAKA_FAILPOINT_TAG", "MAKA_FAILPOINT_SKIP"):
        env.pop(key, None)
    prompt = tmp_path / "system.txt"
    prompt.write_text(SYSTEM, encoding="utf-8")
    call = {"id": "call_1", "type": "function", "function": {"name": "write_file"}}
    call["function"]["arguments"] = json.dumps({"path": "a.txt", "content": "A\n"})  # type: ignore[index]
    chat.reply(200, completion({"content": None, "tool_calls": [call]}, "tool_calls"))
    session_id = f"cfg-{tmp_path.name}"[:60]
    try:
        # P7: the write_file result is committed; the worker dies before the next model step.
        with WorkerProcess(temporal_server, db, queue, home=home, failpoint="P7", extra_env=vendor) as dying:
            dying.wait_ready()
            started = run_maka(
                "session", "start", "--workspace", str(ws_dir), "--model", "openai:test-model",
                "--session-id", session_id, "--system", f"@{prompt}", "--temperature", "0.25",
                "--max-tokens", "77", "--step-timeout", "45", "--max-steps", "9",
                "--continue-as-new-after", "5", "--continue-as-new-after-steps", "8",
                "--model-step-mode", "local", "--offer", "builtins", "--tool-mode", "hybrid",
                "--json", "write a",
                env=env,
            )  # fmt: skip
            assert started.returncode == 0, started.stdout + started.stderr
            assert await dying.wait_exit(90) != 0, "the worker did not die at P7"
        await temporal_client.get_workflow_handle(workflow_id_for(session_id)).terminate("execution lost")
        assert (ws_dir / "a.txt").read_text() == "A\n"

        chat.reply(200, completion({"content": "done"}))
        with WorkerProcess(temporal_server, db, queue, home=home, extra_env=vendor) as worker:
            worker.wait_ready()
            resumed = run_maka("resume", session_id, "--wait", "--json", env=env)
            assert resumed.returncode == 0, resumed.stdout + resumed.stderr
            assert json.loads(resumed.stdout)["decision"] == "continue", resumed.stdout
            await temporal_client.get_workflow_handle(workflow_id_for(session_id)).terminate("closed")
            chat.reply(200, completion({"content": "again"}))
            sent = run_maka("session", "send", session_id, "again", "--wait", "--json", env=env)
            assert sent.returncode == 0, sent.stdout + sent.stderr
            status = run_maka("session", "status", session_id, "--json", env=env)
        inputs = await _inputs(temporal_client, session_id)
    finally:
        chat.httpd.shutdown()
        chat.httpd.server_close()
    record, raw = _record(db, session_id)
    with LedgerStore.open(f"sqlite:///{db}") as store:
        policy = store.session_policy(session_id)
    assert policy is not None
    return Drill(
        inputs, list(chat.requests), json.loads(status.stdout), record, raw, str(policy["policyDigest"])
    )


@pytest.mark.temporal
@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="session")
async def test_resume_and_a_send_over_a_closed_execution_keep_every_setting(drill: Drill) -> None:
    inputs = drill.inputs
    # Three executions (start, resume, send): each runs with the settings the session started with.
    assert len(inputs) == 3, [i.continuation for i in inputs]
    assert inputs[1].continuation is not None and inputs[2].continuation is None
    assert inputs[0].config.host is not None and inputs[0].config.host_wait_s is not None
    for inp in inputs:
        assert inp.config == inputs[0].config  # the host and host wait too
        assert _settings(inp.config) == EXPECTED, (inp.continuation, inp.config)
        assert inp.config.provider.to_json() == {
            "kind": "openai", "model": "test-model", "system": SYSTEM,
            "temperature": 0.25, "maxTokens": 77, "timeoutSeconds": 45.0,
        }  # fmt: skip
    # The vendor saw the system prompt first, and the sampling settings, in every request:
    # the first step, the continuation's and the reopened session's.
    assert len(drill.requests) == 3
    for request in drill.requests:
        assert _model_params(request["body"]) == MODEL_PARAMS, request["body"]
        users = [m for m in request["body"]["messages"] if m["role"] == "user"]
        assert all(SYSTEM not in str(m["content"]) for m in users)  # never a user message
        # ``--offer builtins``: every execution offers the five built-ins, and nothing else.
        offered = {t["function"]["name"] for t in request["body"]["tools"]}
        assert offered == {"read_file", "list_dir", "write_file", "edit_file", "bash"}, offered
    config = drill.status["config"]
    assert config["modelStepMode"] == "local" and config["maxStepsPerTurn"] == 9, config
    assert config["toolMode"] == "hybrid", config
    assert config["continueAsNewAfter"] == 5 and config["modelStepTimeout"] == 45.0, config
    assert "continueAsNewAfterTurns" not in config and "continueAsNewAfterSteps" in config, config

    # Negative control: the record as the writer before SessionConfig wrote it (workspace, provider,
    # queue, host) decodes with the defaults: a new execution built from it loses the settings.
    record, raw = drill.record, drill.raw
    assert record is not None and _settings(record.config) == EXPECTED
    legacy = SessionRecord.from_json({k: v for k, v in raw.items() if k in LEGACY_KEYS})
    assert legacy is not None and _settings(legacy.config) != EXPECTED
    assert legacy.config.max_steps_per_turn == 100_000 and legacy.config.model_step_mode == "with_tool"


#: The keys of the session record before ``SessionConfig`` (what it always carried).
LEGACY_KEYS = ("workspace", "workspaceIdentity", "provider", "taskQueue", "host", "hostWait")
#: Every setting of the config, as the pinned session was started with it.
PER_SETTING: dict[str, Any] = {
    "provider": {
        "kind": "openai", "model": "test-model", "system": SYSTEM,
        "temperature": 0.25, "maxTokens": 77, "timeoutSeconds": 45.0,
    },
    **EXPECTED,
    "host": HOST,
    "host_wait_s": float(HOST_WAIT),
    "policy_digest": None,  # the digest the ledger recorded for the session (``Drill.policy_digest``)
    "tool_set": ["builtins"],
}  # fmt: skip


@pytest.mark.temporal
@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("setting", sorted(PER_SETTING))
async def test_each_setting_survives_a_resume_and_a_send_after_close(drill: Drill, setting: str) -> None:
    """One setting: the same in the start's, the resume's and the reopened execution's input, in
    the ledger record and in ``session status --json``'s ``config`` (camelCase)."""
    want = PER_SETTING[setting] if setting != "policy_digest" else drill.policy_digest

    def value(config: SessionConfig) -> Any:
        got = getattr(config, setting)
        return got.to_json() if setting == "provider" else list(got) if setting == "tool_set" and got else got

    assert len(drill.inputs) == 3
    assert [value(inp.config) for inp in drill.inputs] == [want] * 3, setting
    assert drill.record is not None and value(drill.record.config) == want
    camel = {"host_wait_s": "hostWait", "model_step_timeout_s": "modelStepTimeout"}.get(
        setting, to_camel(setting)
    )
    shown = {"continueAsNewAfterTurns": "continueAsNewAfter"}.get(camel, camel)  # status's name
    assert drill.status["config"][shown] == want, (shown, drill.status["config"])
    if camel not in LEGACY_KEYS:
        # Negative control: the record as written before SessionConfig lacks it, and reads the default.
        legacy = SessionRecord.from_json({k: v for k, v in drill.raw.items() if k in LEGACY_KEYS})
        assert legacy is not None and value(legacy.config) != want, setting


@pytest.mark.temporal
@pytest.mark.asyncio(loop_scope="session")
async def test_the_system_prompt_and_max_tokens_reach_the_messages_request(
    temporal_server: Any, tmp_path: Path, ws_dir: Path
) -> None:
    home = tmp_path / "home"
    db = home / "ledger.sqlite"
    queue = f"claude-cfg-{tmp_path.name}"[:60]
    claude = MessagesServer()
    vendor = {"ANTHROPIC_API_KEY": "sk-ant-local", "ANTHROPIC_BASE_URL": claude.url}
    env = {**os.environ, "MAKA_HOME": str(home), "TEMPORAL_ADDRESS": temporal_server.address}
    env.update(MAKA_TASK_QUEUE=queue, MAKA_DB=str(db))
    prompt = tmp_path / "system.md"
    prompt.write_text(SYSTEM, encoding="utf-8")
    claude.reply(message(text("done")))
    try:
        with WorkerProcess(temporal_server, db, queue, home=home, extra_env=vendor) as worker:
            worker.wait_ready()
            started = run_maka(
                "session", "start", "--workspace", str(ws_dir), "--model", "anthropic:claude-test",
                "--system", f"@{prompt}", "--max-tokens", "321", "--wait",
                "--json", "hello",
                env=env,
            )  # fmt: skip
        assert started.returncode == 0, started.stdout + started.stderr
    finally:
        claude.close()
    (request,) = claude.requests
    body = request.body
    assert (body["system"], body["max_tokens"]) == (SYSTEM, 321) and "temperature" not in body, body
    assert all(SYSTEM not in json.dumps(m) for m in body["messages"])


async def _step_timeouts(client: Client, session_id: str) -> list[list[str]]:
    """Per execution (oldest first), the start-to-close of every scheduled model step."""
    out: list[tuple[Any, list[str]]] = []
    async for execution in client.list_workflows(f"WorkflowId = '{workflow_id_for(session_id)}'"):
        history = await client.get_workflow_handle(execution.id, run_id=execution.run_id).fetch_history()
        scheduled = [
            e["activityTaskScheduledEventAttributes"]
            for e in json.loads(history.to_json())["events"]
            if "activityTaskScheduledEventAttributes" in e
        ]
        steps = [a["startToCloseTimeout"] for a in scheduled if a["activityType"]["name"] == MODEL_STEP]
        out.append((execution.start_time, steps))
    return [steps for _, steps in sorted(out, key=lambda pair: pair[0])]


@pytest.mark.temporal
@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("variant", ["session", "fixed_timeout"])
async def test_the_step_timeout_and_settings_carry_across_continue_as_new(
    variant: str, temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    """Each execution schedules its model steps with the session's step timeout. Negative control:
    the workflow with the timeout fixed at 120 s (as before the config) fails the same check."""
    from maka_temporal.workflows.session import SessionWorkflow
    from tests.children.fixed_step_timeout_workflow import FixedStepTimeoutWorkflow

    script = write_script(tmp_path / "script.json", [{"text": "one"}, {"text": "two"}])
    workflow = SessionWorkflow if variant == "session" else FixedStepTimeoutWorkflow
    settings = {"model_step_mode": "activity", "max_steps_per_turn": 7, "model_step_timeout_s": 33.0}
    async with in_process_worker(temporal_client, tmp_path / "ledger.sqlite", task_queue, workflow=workflow):
        session_id, first = await start(
            temporal_client, ws_dir, script, task_queue, continue_as_new_after=1,
            model_step_mode="activity", max_steps_per_turn=7, step_timeout_s=33.0,
        )  # fmt: skip
        await wait_turn(temporal_client, session_id, first.run_id)
        second = None
        for _ in range(100):  # the execution continues as new after its one turn
            try:
                second = await send_message(temporal_client, session_id, "again", refusals=True)
                break
            except MakaError as exc:
                assert exc.code in ("continuing_as_new", "turn_in_flight"), exc.code
                await asyncio.sleep(0.1)
        assert second is not None, "the continued execution never took the message"
        await wait_turn(temporal_client, session_id, second.run_id)
    inputs = await _inputs(temporal_client, session_id)
    assert len(inputs) >= 2 and inputs[1].continued_runs == 1
    for inp in inputs:
        assert {k: getattr(inp.config, k) for k in settings} == settings
        assert inp.config.continue_as_new_after_turns == 1
    timeouts = await _step_timeouts(temporal_client, session_id)
    kept = timeouts[:2] == [["33s"], ["33s"]]
    assert kept is (variant == "session"), timeouts


# --- refusals ------------------------------------------------------------------------------------


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str | None]:
    # Nothing listens at this address: a command that reached Temporal would say temporal_unavailable.
    return {
        "MAKA_HOME": str(tmp_path / "home"),
        "TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",
        "MAKA_DB": None,
        "MAKA_TASK_QUEUE": None,
        "MAKA_POLICY": None,
    }


def _start(env: dict[str, str | None], ws: Path, *args: str) -> Result:
    argv = ["session", "start", "--workspace", str(ws), "--json", *args, "hi"]
    return CliRunner().invoke(maka, argv, env=env, catch_exceptions=False)


@pytest.mark.parametrize(
    ("args", "code", "setting"),
    [
        (("--model", "openai:m", "--system", "@/nonexistent/system.txt"), "system_file_unreadable", None),
        (("--model", "openai:m", "--system", "   "), "config_invalid", "system"),
        (("--model", "openai:m", "--system", "x" * (16 * 1024 + 1)), "config_invalid", "system"),
        (("--model", "openai:m", "--temperature", "2.5"), "config_invalid", "temperature"),
        (("--model", "openai:m", "--temperature", "-0.1"), "config_invalid", "temperature"),
        (("--model", "anthropic:c", "--temperature", "1.5"), "config_invalid", "temperature"),
        (("--model", "openai:m", "--max-tokens", "0"), "config_invalid", "max_tokens"),
        (("--model", "openai:m", "--step-timeout", "0"), "config_invalid", "step_timeout_s"),
        (("--model", "openai:m", "--step-timeout", "5000"), "config_invalid", "step_timeout_s"),
        (("--model", "openai:m", "--step-timeout", "0.5"), "config_invalid", "step_timeout_s"),
    ],
)
def test_a_bad_setting_is_refused_before_anything_is_written(
    cli_env: dict[str, str | None], tmp_path: Path, args: tuple[str, ...], code: str, setting: str | None
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    result = _start(cli_env, ws, *args)
    assert result.exit_code == 2, result.output
    body = json.loads(result.stdout)
    assert body["ok"] is False and body["code"] == code, body
    if setting is not None:
        assert body["setting"] == setting, body
    assert "Traceback" not in result.output
    assert not list(ws.iterdir()), "the workspace marker was written"
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").rglob("*.sqlite")), "a ledger"


def test_model_parameters_on_a_script_are_refused_not_dropped(
    cli_env: dict[str, str | None], tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"steps": [{"text": "hi"}]}))
    for flag, value in (("--system", "be brief"), ("--temperature", "0.1"), ("--max-tokens", "5")):
        body = json.loads(_start(cli_env, ws, "--script", str(script), flag, value).stdout)
        assert body["code"] == "config_invalid" and body["setting"] == flag, body
    assert not list(ws.iterdir())


# --- persisted shapes ----------------------------------------------------------------------------

#: A SessionInput as a worker before SessionConfig recorded it (flat settings, no step timeout).
FLAT_INPUT = {
    "session_id": "s", "workspace": "/w", "workspace_identity": "i", "task_queue": "q",
    "provider": {"kind": "openai", "model": "m", "system": "sys"},
    "continue_as_new_after_turns": 3, "continue_as_new_after_steps": 4, "model_step_mode": "local",
    "max_steps_per_turn": 7, "host": "h", "host_wait_s": 2.5, "turns": 2, "continued_runs": 1,
}  # fmt: skip


def test_a_flat_input_recorded_before_the_config_decodes_into_it_and_keeps_its_keys() -> None:
    converter = pydantic_data_converter.payload_converter
    (payload,) = converter.to_payloads([FLAT_INPUT])
    (inp,) = converter.from_payloads([payload], [SessionInput])
    assert isinstance(inp, SessionInput) and inp.turns == 2
    assert (inp.config.max_steps_per_turn, inp.config.model_step_mode, inp.config.host) == (7, "local", "h")
    # The recorded 120 s: a replay schedules the model step with the timeout it always had.
    assert inp.config.model_step_timeout_s == 120.0
    (again,) = converter.to_payloads([inp])
    encoded = json.loads(again.data)
    assert "config" not in encoded
    assert {k: encoded[k] for k in FLAT_INPUT} == FLAT_INPUT  # an older worker reads the same keys
    (back,) = converter.from_payloads([again], [SessionInput])
    assert back == inp


def test_a_session_record_round_trips_and_an_older_one_reads_with_the_defaults() -> None:
    config = SessionConfig(provider={"kind": "script", "path": "/s.json"}, **EXPECTED)  # type: ignore[arg-type]
    record = SessionRecord("/w", "id-1", config, "maka")
    raw = record.to_json()
    assert raw["provider"] == {"kind": "script", "path": "/s.json"} and raw["taskQueue"] == "maka"
    assert raw["maxStepsPerTurn"] == 9 and raw["modelStepMode"] == "local"
    assert SessionRecord.from_json(raw) == record
    older = {"workspace": "/w", "workspaceIdentity": "id-1", "provider": {"kind": "script", "path": "/s"}}
    decoded = SessionRecord.from_json(older)
    assert decoded is not None and decoded.config == SessionConfig(provider={"kind": "script", "path": "/s"})
    assert SessionRecord.from_json({**older, "maxStepsPerTurn": "many"}) is None


def test_status_names_continue_as_new_after_while_the_record_keeps_its_key() -> None:
    """``session status --json`` says ``continueAsNewAfter`` (issue 19); the ledger record keeps
    ``continueAsNewAfterTurns``, and both spellings decode, so a record written before reads."""
    from maka_core.runtime.contracts import SessionConfig

    config = SessionConfig(
        provider={"kind": "script", "path": "/s.json"},
        continue_as_new_after_turns=5,
        continue_as_new_after_steps=7,
    )
    stored, shown = config.to_json(), config.status_json()
    assert stored["continueAsNewAfterTurns"] == 5 and "continueAsNewAfter" not in stored
    assert shown["continueAsNewAfter"] == 5 and "continueAsNewAfterTurns" not in shown
    assert shown["continueAsNewAfterSteps"] == 7
    assert SessionConfig.from_json(stored) == config
    assert SessionConfig.from_json(shown) == config
