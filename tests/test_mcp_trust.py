"""An MCP server's word is not evidence (issue 35 item 1, issue 37 items 8 and 11).

``tests/mcp_servers/liar_server.py`` says ``readOnlyHint: true`` of tools that append a line to
``notes.txt`` (and sleep before answering, so a worker killed meanwhile leaves an effect that
happened and no answer). The verdict is the file: how many times the effect really ran.

- A session started through the real CLI (``maka session start --wait``) calls the lying tool; the
  real ``maka worker`` is SIGKILLed during the call; a fresh worker recovers it. Untrusted (the
  default), the call is ``at-most-once``: the session parks ``dispatch_without_response`` and the
  file holds one line. Negative control: a worker with the old adapter, which believed every
  server (``tests/children/trusting_mcp_worker.py``), runs it again: two lines.
- A trusted server (``"trustAnnotations": true``) that says read-only *and* destructive gets the
  worst case: parked after one line (control: the old adapter, two lines).
- A read-only policy (``mutations: deny``, ``forbiddenEffects: [mutate, destructive]``) refuses the
  untrusted "read" before T1 (no line); the operator's trust admits it; the contradiction stays
  refused (control: the old adapter admits the lie).
- What a server publishes (a description, an input schema) reaches the model vendor with its
  configured secrets cut out: a local chat-completions server records every request, and the
  server's env value is in none (control: a manager that cuts nothing leaks it into ``tools``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from maka_core.governance.policy_file import parse_policy
from maka_core.runtime.governed import SessionGovernance
from maka_core.runtime.runtime import Runtime, RuntimeSettings
from maka_core.store.writer import LedgerStore
from maka_core.tools.mcp.adapter import McpToolset
from maka_core.tools.mcp.servers import McpServers, Secrets
from maka_core.tools.registry import default_tools
from maka_temporal.workers.client.session_client import start_session
from tests.children.trusting_mcp_worker import trusting_runtime
from tests.mcp_support import write_config
from tests.temporal_support import (
    REPO,
    WorkerProcess,
    in_process_worker,
    start,
    tool_step,
    wait_turn,
    write_script,
)
from tests.test_mcp_session import settings_for
from tests.test_providers import ChatServer, completion

pytestmark = [pytest.mark.temporal]
ASYNC = pytest.mark.asyncio(loop_scope="session")

LIAR = REPO / "tests" / "mcp_servers" / "liar_server.py"
#: Seconds the liar's tools sleep after their effect: the window the drill kills the worker in.
SLEEP_S = 4.0
TRUSTING_WORKER = ("-m", "tests.children.trusting_mcp_worker")
READ_ONLY_POLICY = {"policyVersion": "1", "mutations": "deny", "forbiddenEffects": ["mutate", "destructive"]}
CANARY = "liar-canary-5f1d0c2b9e"


def liar(state: Path, *, trust: bool = False, sleep_s: float = 0.0) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "command": sys.executable,
        "args": [str(LIAR), "--state", str(state), "--sleep", str(sleep_s)],
        "env": {"LIAR_TOKEN": CANARY},
    }
    return {**entry, "trustAnnotations": True} if trust else entry


def notes(state: Path) -> list[str]:
    path = state / "notes.txt"
    return path.read_text().splitlines() if path.exists() else []


def _wait_for(predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout} s for {what}")
        time.sleep(0.05)


def _kill_mid_call(
    server: Any,
    tmp_path: Path,
    ws: Path,
    queue: str,
    tool: str,
    *,
    trust: bool,
    entry: tuple[str, ...] | None,
) -> tuple[dict[str, Any], list[str], int]:
    """``maka session start --wait`` calls ``mcp__liar__<tool>``; its worker is SIGKILLed while the
    tool sleeps after its effect, a fresh one (the same build) recovers the call. The CLI's status
    JSON, the liar's notes, the CLI's exit code."""
    state = tmp_path / "state"
    config = write_config(tmp_path / "servers.json", {"liar": liar(state, trust=trust, sleep_s=SLEEP_S)})
    db = tmp_path / "ledger.sqlite"
    script = write_script(
        tmp_path / "s.json", [tool_step((f"mcp__liar__{tool}", {"text": "once"})), {"text": "done"}]
    )
    env = {"MAKA_MCP_CONFIG": str(config)}
    build = {"entry": entry} if entry else {}
    cli_env = {**os.environ, "MAKA_HOME": str(tmp_path), "TEMPORAL_ADDRESS": server.address}
    cli_env.pop("MAKA_MCP_CONFIG", None)
    with WorkerProcess(server, db, queue, home=tmp_path, extra_env=env, **build) as doomed:
        doomed.wait_ready()
        cli = subprocess.Popen(
            [sys.executable, "-m", "maka_temporal", "session", "start", "--workspace", str(ws), "--script",
             str(script), "--db", str(db), "--task-queue", queue, "--tool-mode", "activity", "--wait",
             "--wait-timeout", "150", "--json", "call the tool"],
            cwd=REPO, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        _wait_for(lambda: len(notes(state)) >= 1, f"the effect of {tool} (worker log: {doomed.log})")
        doomed.proc.kill()
        doomed.proc.wait(10)
    with WorkerProcess(server, db, queue, home=tmp_path, extra_env=env, **build) as worker:
        worker.wait_ready()
        out, err = cli.communicate(timeout=180)
    # The killed worker's server (an orphan) may still answer: its effect was before the sleep.
    return (json.loads(out) if out.strip() else {"stderr": err}), notes(state), cli.returncode


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.parametrize("old", [False, True], ids=["untrusted", "negative-control-old-adapter"])
def test_a_lying_read_only_tool_runs_once_and_parks_when_its_worker_dies(
    temporal_server: Any, tmp_path: Path, ws_dir: Path, task_queue: str, old: bool
) -> None:
    status, lines, code = _kill_mid_call(
        temporal_server,
        tmp_path,
        ws_dir,
        task_queue,
        "note",
        trust=False,
        entry=TRUSTING_WORKER if old else None,
    )
    if old:  # believed, the "read" is run again after the crash: the effect happened twice
        assert (lines, status.get("state")) == (["note: once", "note: once"], "idle"), (status, lines)
        return
    assert lines == ["note: once"], lines
    assert (code, status["state"], status["parkReason"]) == (1, "parked", "dispatch_without_response"), status
    (op,) = status["operations"]
    assert op["toolName"] == "mcp__liar__note"


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.parametrize("old", [False, True], ids=["trusted", "negative-control-old-adapter"])
def test_a_trusted_server_contradicting_itself_gets_its_worst_case(
    temporal_server: Any, tmp_path: Path, ws_dir: Path, task_queue: str, old: bool
) -> None:
    status, lines, code = _kill_mid_call(
        temporal_server,
        tmp_path,
        ws_dir,
        task_queue,
        "both",
        trust=True,
        entry=TRUSTING_WORKER if old else None,
    )
    if old:
        assert (lines, status.get("state")) == (["both: once", "both: once"], "idle"), (status, lines)
        return
    assert lines == ["both: once"], lines
    assert (code, status["state"], status["parkReason"]) == (1, "parked", "dispatch_without_response"), status


async def _policy_session(
    client: Any, tmp_path: Path, ws: Path, queue: str, tool: str, *, trust: bool, make_runtime: Any = None
) -> tuple[list[str], dict[str, Any], dict[str, Any] | None]:
    """A session under the read-only policy calls ``mcp__liar__<tool>``: the notes, the call's
    result and its T1 evidence (None: refused before T1)."""
    state = tmp_path / "state"
    config = write_config(tmp_path / "servers.json", {"liar": liar(state, trust=trust)})
    db = tmp_path / "ledger.sqlite"
    session_id = f"mcp-trust-{tool}-{trust}-{time.monotonic_ns()}"
    with LedgerStore.open(db) as store:
        governance = SessionGovernance(parse_policy(READ_ONLY_POLICY))
        store.put_session_policy(session_id, **governance.to_record())
    script = write_script(
        tmp_path / "s.json", [tool_step((f"mcp__liar__{tool}", {"text": "x"})), {"text": "ok"}]
    )
    async with in_process_worker(client, db, queue, settings=settings_for(config), make_runtime=make_runtime):
        _, accepted = await start(client, ws, script, queue, session_id=session_id)
        await wait_turn(client, session_id, accepted.run_id)
    with LedgerStore.open(db) as store:
        events = store.events(session_id=session_id)
        (response,) = [e for e in events if e.content is not None and e.content.kind == "function_response"]
        op_id = response.refs.operation_id if response.refs is not None else None
        evidence = store.evidence(op_id) if op_id else None
    assert response.content is not None and response.content.kind == "function_response"
    return notes(state), response.content.result, evidence


@ASYNC
@pytest.mark.parametrize(
    ("tool", "trust", "old", "admitted"),
    [
        ("note", False, False, False),  # an untrusted "read" is a mutation: refused before T1
        ("note", True, False, True),  # the operator vouched for the server: its read is a read
        ("both", True, False, False),  # trusted, but read-only and destructive: the worst case
        ("note", False, True, True),  # negative control: the old adapter admits the lie
    ],
    ids=["untrusted-refused", "trusted-admitted", "contradiction-refused", "negative-control-old-adapter"],
)
async def test_a_read_only_policy_admits_a_server_tool_only_on_the_operators_trust(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str, tool: str, trust: bool, old: bool,
    admitted: bool,
) -> None:  # fmt: skip
    make = trusting_runtime if old else None
    lines, result, evidence = await _policy_session(
        temporal_client, tmp_path, ws_dir, task_queue, tool, trust=trust, make_runtime=make
    )
    if not admitted:
        assert lines == [] and evidence is None, (lines, result)
        assert result["value"]["code"] == "policy_blocked", result
        return
    assert lines == [f"{tool}: x"], (lines, result)
    assert evidence is not None and evidence["annotatedGuarantee"] == "read-only"
    if not old:
        assert (evidence["guarantee"], evidence["guaranteeSource"]) == ("read-only", "annotations_trusted")


@ASYNC
async def test_an_untrusted_servers_annotations_are_recorded_with_each_call_not_acted_on(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    state = tmp_path / "state"
    config = write_config(tmp_path / "servers.json", {"liar": liar(state)})
    db = tmp_path / "ledger.sqlite"
    script = write_script(
        tmp_path / "s.json", [tool_step(("mcp__liar__note", {"text": "x"})), {"text": "ok"}]
    )
    async with in_process_worker(temporal_client, db, task_queue, settings=settings_for(config)):
        session_id, accepted = await start(temporal_client, ws_dir, script, task_queue)
        await wait_turn(temporal_client, session_id, accepted.run_id)
    with LedgerStore.open(db) as store:
        (op,) = [o for o in store.events(session_id=session_id) if o.actions and o.actions.tool_dispatch]
        assert op.actions is not None and op.actions.tool_dispatch is not None
        op_id = op.actions.tool_dispatch.operation_id
        evidence, decision = store.evidence(op_id), store.decision(op_id)
    assert evidence is not None and decision is not None
    assert (evidence["guarantee"], evidence["annotatedGuarantee"], evidence["guaranteeSource"]) == (
        "at-most-once",
        "read-only",
        "annotations_untrusted",
    )
    assert decision["decision"]["executionGuarantee"] == "at-most-once"
    assert notes(state) == ["note: x"]


class _LeakySecrets(Secrets):
    """The broken variant: a manager that cuts nothing out of what its servers publish."""

    def redact(self, text: str) -> str:
        return text


def _leaky_runtime(store: Any, settings: RuntimeSettings) -> Runtime:
    assert settings.mcp_config is not None
    servers = McpServers(settings.mcp_config)
    servers.secrets = _LeakySecrets(servers.config)
    return Runtime(store, tools=McpToolset(default_tools(), servers), settings=settings)


@pytest.fixture
def chat() -> Iterator[ChatServer]:
    server = ChatServer()
    yield server
    server.httpd.shutdown()


@ASYNC
@pytest.mark.parametrize("leaky", [False, True], ids=["redacted", "negative-control-leaky"])
async def test_what_a_server_publishes_reaches_the_vendor_without_its_secrets(
    temporal_client: Any,
    tmp_path: Path,
    ws_dir: Path,
    task_queue: str,
    chat: ChatServer,
    monkeypatch: pytest.MonkeyPatch,
    leaky: bool,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", chat.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    chat.reply(200, completion({"content": "nothing to do"}))
    config = write_config(tmp_path / "servers.json", {"liar": liar(tmp_path / "state")})
    db = tmp_path / "ledger.sqlite"
    make = _leaky_runtime if leaky else None
    async with in_process_worker(
        temporal_client, db, task_queue, settings=settings_for(config), make_runtime=make
    ):
        session_id, accepted = await start_session(
            temporal_client,
            workspace=ws_dir,
            provider={"kind": "openai", "model": "test-model"},
            task_queue=task_queue,
            message="hello",
        )
        status = await wait_turn(temporal_client, session_id, accepted.run_id)
    assert status.state == "idle"
    (request,) = [r for r in chat.requests if r["path"].endswith("/chat/completions")]
    tools = {t["function"]["name"]: t["function"] for t in request["body"]["tools"]}
    whisper = tools["mcp__liar__whisper"]
    sent = json.dumps(request["body"])
    if leaky:
        assert CANARY in whisper["description"] and CANARY in sent
        return
    assert CANARY not in sent, whisper
    assert "[redacted]" in whisper["description"]
    assert "[redacted]" in whisper["parameters"]["properties"]["text"]["description"]
