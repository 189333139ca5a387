"""An MCP server's word is not evidence (issues 35.1, 37.8, 37.11), through the real CLI and real
``maka worker`` processes, with a real MCP server whose annotations lie (``mcp_servers/hint_server.py``:
``append`` says ``readOnlyHint`` and appends a line to a file, ``clobber`` says read-only and
destructive, ``whisper`` says its secret in its tool list).

- The reproduction: ``maka session start --wait`` calls ``append`` (it sleeps 4 s after writing);
  the worker is SIGKILLed while it sleeps; a fresh worker settles the call. The file holds one line
  and the session parks ``dispatch_without_response``. Negative control: both workers built with the
  old trusting adapter (``tests/children/trusting_mcp_worker.py``) run it again: two lines, idle.
  Our variant: the call dispatched by an old trusting worker and recovered by a new one parks too
  (the recorded ``read-only`` is held to what is trusted now).
- The policy: ``mutations: deny`` + ``forbiddenEffects: ["mutate", "destructive"]`` denies the
  untrusted read-only-annotated tool before T1; ``trustAnnotations: true`` admits it; the old adapter
  admits it untrusted (control).
- Contradictory hints on a trusted server: ``clobber`` is denied by the same policy and parks after
  a P4 kill (one line); the old adapter admits it and runs it twice (control).
- The worker names each server whose annotations it ignores at start (text and ``--json``).
- The secret: a server's env value in its tool's title, description and schema never reaches the
  vendor (a local OpenAI chat-completions server records every request body) nor the ledger; the
  leaky manager's catalog leaks it (control); a tool without a secret keeps its catalog digest.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from maka_core.runtime import model_step, turn
from maka_core.runtime.contracts import BeginRunInput, ModelStepInput, RunIds
from maka_core.runtime.runtime import Runtime, RuntimeSettings
from maka_core.runtime.session_view import operations
from maka_core.store.writer import LedgerStore
from maka_core.tools.mcp import load_mcp_config
from maka_core.tools.mcp.adapter import McpToolset
from maka_core.tools.mcp.redaction import Secrets
from maka_core.tools.mcp.servers import McpServers
from maka_core.tools.registry import default_tools
from maka_core.workspace import Workspace
from tests.mcp_support import write_config
from tests.temporal_support import REPO, WorkerProcess, tool_step, write_script
from tests.test_cli_session import _env
from tests.windowed_vendor import WindowedVendor

HINT = REPO / "tests" / "mcp_servers" / "hint_server.py"
WORKER: tuple[str, ...] = ("-m", "maka_temporal", "worker")
#: The negative control's worker: ``maka worker`` with the old trusting MCP adapter.
TRUSTING: tuple[str, ...] = ("-m", "tests.children.trusting_mcp_worker")
READ_ONLY_POLICY = {"policyVersion": "1", "mutations": "deny", "forbiddenEffects": ["mutate", "destructive"]}
CANARY = "hint-canary-5e0c2b7d"


class Box:
    """One drill's sandbox: a servers file naming hint servers (each trusted or not), a home, a
    ledger, a queue; each session gets a workspace of its own."""

    def __init__(self, server: Any, tmp_path: Path, servers: dict[str, bool]) -> None:
        self.server, self.tmp, self.sessions = server, tmp_path, 0
        self.states = {name: tmp_path / f"state-{name}" for name in servers}
        self.config = write_config(
            tmp_path / "servers.json",
            {
                name: {
                    "command": sys.executable,
                    "args": [str(HINT), "--state", str(self.states[name])],
                    **({"trustAnnotations": True} if trusted else {}),
                }
                for name, trusted in servers.items()
            },
        )
        self.home = tmp_path / "home"
        self.env = {**_env(self.home, server.address), "MAKA_MCP_CONFIG": str(self.config)}
        self.db, self.queue = self.home / "ledger.sqlite", self.env["MAKA_TASK_QUEUE"]

    def worker(self, entry: tuple[str, ...], **kwargs: Any) -> WorkerProcess:
        return WorkerProcess(
            self.server,
            self.db,
            self.queue,
            home=self.home,
            entry=entry,
            extra_env={"MAKA_MCP_CONFIG": str(self.config)},
            **kwargs,
        )

    def start(self, server: str, tool: str, args: dict[str, Any], *extra: str) -> subprocess.Popen[str]:
        """``maka session start ... --wait --json`` as a process (it waits while workers come and go)."""
        self.sessions += 1
        ws = self.tmp / f"ws-{self.sessions}"
        ws.mkdir()
        script = write_script(
            self.tmp / f"s-{self.sessions}.json",
            [tool_step((f"mcp__{server}__{tool}", args)), {"text": "done"}],
        )
        argv = ["session", "start", "--workspace", str(ws), "--script", str(script), *extra]
        return subprocess.Popen(
            [sys.executable, "-m", "maka_temporal", *argv, "--wait", "--json", "go"],
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def effects(self, server: str = "hint") -> list[str]:
        """The lines the server's tools wrote: one per run of the effect."""
        log = self.states[server] / "effects.log"
        return log.read_text().splitlines() if log.exists() else []

    def call_facts(self, session_id: str) -> tuple[Any, dict[str, Any] | None, dict[str, Any] | None, Any]:
        """The session's one operation, its T1 evidence, its recorded decision and its result."""
        with LedgerStore.open(self.db) as store:
            assert store.verify() == []
            events = store.events(session_id=session_id)
            (op,) = operations(events)
            results = [e.content.result for e in events if e.role == "tool" and e.content is not None]
            assert len(results) <= 1, results
            result = results[0] if results else None  # a parked call has none
            return op, store.evidence(op.operation_id), store.decision(op.operation_id), result

    def end_servers(self) -> None:
        for state in self.states.values():
            end_servers(state)


def end_servers(state: Path) -> None:
    """SIGKILL the hint servers a killed worker left behind (by the pids they wrote, each checked to
    still be a hint server of ``state``: a pid is never taken on trust)."""
    pids = state / "pids"
    for line in pids.read_text().split() if pids.exists() else []:
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{line}/cmdline").read_bytes()
            if str(HINT).encode() in cmdline and str(state).encode() in cmdline:
                os.kill(int(line), signal.SIGKILL)


@pytest.fixture
def box_of(temporal_server: Any, tmp_path: Path) -> Iterator[Callable[..., Box]]:
    made: list[Box] = []

    def make(servers: dict[str, bool]) -> Box:
        made.append(Box(temporal_server, tmp_path, servers))
        return made[-1]

    yield make
    for box in made:
        box.end_servers()


def _until(what: str, done: Callable[[], bool], seen: Callable[[], str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what} never happened; saw: {seen()}"
        time.sleep(0.05)


def _settled(waiter: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = waiter.communicate(timeout=150)
    assert out.strip(), f"session start --wait printed nothing (exit {waiter.returncode}): {err}"
    status: dict[str, Any] = json.loads(out)
    return status


def _crash_drill(
    box: Box,
    tool: str,
    args: dict[str, Any],
    first: tuple[str, ...],
    second: tuple[str, ...],
    *,
    p4: bool = False,
) -> tuple[dict[str, Any], str]:
    """The turn calls ``tool``; the first worker dies (SIGKILLed by the test while the tool sleeps
    after its write, or by itself at P4), the second settles the call. The session's final status
    and the first worker's log."""
    doomed = box.worker(first, **({"failpoint": "P4", "failpoint_tag": f"mcp__hint__{tool}"} if p4 else {}))
    waiter = None
    try:
        doomed.wait_ready(60)
        waiter = box.start("hint", tool, args)
        if p4:
            _until("the P4 SIGKILL", lambda: doomed.proc.poll() is not None, doomed.log.read_text, 90)
            assert doomed.proc.returncode == -signal.SIGKILL, doomed.log.read_text()
        else:
            _until("the tool's write", lambda: len(box.effects()) == 1, doomed.log.read_text)
            doomed.proc.kill()  # while the tool sleeps after writing
            doomed.proc.wait(30)
        first_log = doomed.log.read_text()
    except BaseException:
        if waiter is not None:
            waiter.kill()
        raise
    finally:
        doomed.stop()
    with box.worker(second) as worker:
        worker.wait_ready(60)
        status = _settled(waiter)
    return status, first_log


# --- the reproduction: a worker killed while a lying read-only tool sleeps -------------------------


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.temporal
@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        (WORKER, WORKER, ("parked", "dispatch_without_response", 1)),
        (TRUSTING, WORKER, ("parked", "dispatch_without_response", 1)),
        (TRUSTING, TRUSTING, ("idle", None, 2)),
    ],
    ids=["untrusted", "dispatched-by-an-old-worker", "negative-control-trusting-adapter"],
)
def test_a_read_only_annotation_from_an_untrusted_server_never_buys_a_second_run(
    box_of: Callable[..., Box], first: tuple[str, ...], second: tuple[str, ...], expected: tuple[Any, ...]
) -> None:
    box = box_of({"hint": False})
    status, first_log = _crash_drill(box, "append", {"line": "written", "seconds": 4}, first, second)
    effects = box.effects()
    assert (status["state"], status.get("parkReason"), len(effects)) == expected, (status, effects)
    op, evidence, decision, _ = box.call_facts(status["sessionId"])
    assert evidence is not None and decision is not None
    if first == WORKER:
        # The server's word is on record beside what was decided, and the worker said so at start.
        assert (evidence["schema"], evidence["guaranteeSource"], evidence["annotationsTrusted"]) == (
            "mcp.call/v2",
            "untrusted_default",
            False,
        )
        assert (evidence["annotatedGuarantee"], evidence["annotations"]) == (
            "read-only",
            {"readOnlyHint": True},
        )
        assert decision["decision"]["executionGuarantee"] == "at-most-once"
        assert "maka worker: mcp server hint: its annotations are not trusted" in first_log, first_log
        assert "append (readOnlyHint: true)" in first_log
    else:  # the old worker recorded read-only on the server's word
        assert decision["decision"]["executionGuarantee"] == "read-only"
    if expected[0] == "parked":
        assert op.dispatch_event_id and not op.response_event_id  # T1, and no T2 ever


# --- the policy: a read-only policy is not talked past ------------------------------------------


#: Per worker build: (server, tool, admitted) under the read-only policy; ``liar`` is not trusted,
#: ``vouched`` is (``clobber`` says read-only and destructive).
POLICY_CASES: dict[tuple[str, ...], list[tuple[str, str, bool]]] = {
    WORKER: [("liar", "append", False), ("vouched", "append", True), ("vouched", "clobber", False)],
    TRUSTING: [("liar", "append", True), ("vouched", "clobber", True)],
}


@pytest.mark.slow
@pytest.mark.temporal
@pytest.mark.parametrize(
    "entry", [WORKER, TRUSTING], ids=["maka-worker", "negative-control-trusting-adapter"]
)
def test_a_read_only_policy_admits_a_server_tool_only_on_trust(
    box_of: Callable[..., Box], entry: tuple[str, ...]
) -> None:
    box = box_of({"liar": False, "vouched": True})
    policy = box.tmp / "policy.json"
    policy.write_text(json.dumps(READ_ONLY_POLICY))
    seen = []
    with box.worker(entry) as worker:
        worker.wait_ready(60)
        for server, tool, _ in POLICY_CASES[entry]:
            line = f"{server}-{tool}"
            status = _settled(box.start(server, tool, {"line": line}, "--policy", str(policy)))
            assert status["state"] == "idle", status
            op, evidence, _, result = box.call_facts(status["sessionId"])
            ran = line in box.effects(server)
            if ran:
                assert op.dispatch_event_id and not op.is_error, result
            else:  # refused before T1: the server never saw the call
                assert op.dispatch_event_id is None and evidence is None, result
                assert result["value"]["code"] == "policy_blocked", result
            seen.append((server, tool, ran))
    assert seen == POLICY_CASES[entry]


# --- contradictory hints on a trusted server: the worst case --------------------------------------


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.temporal
@pytest.mark.parametrize(
    ("entry", "expected"),
    [(WORKER, ("parked", "dispatch_without_response", 1)), (TRUSTING, ("idle", None, 2))],
    ids=["contradictory", "negative-control-read-only-wins"],
)
def test_a_trusted_tool_that_says_read_only_and_destructive_parks_after_a_p4_kill(
    box_of: Callable[..., Box], entry: tuple[str, ...], expected: tuple[Any, ...]
) -> None:
    box = box_of({"hint": True})
    status, first_log = _crash_drill(box, "clobber", {"line": "written"}, entry, entry, p4=True)
    effects = box.effects()
    assert (status["state"], status.get("parkReason"), len(effects)) == expected, (status, effects)
    assert "annotations are not trusted" not in first_log  # a trusted server is not named
    _, evidence, _, _ = box.call_facts(status["sessionId"])
    assert evidence is not None
    if entry == WORKER:
        assert (evidence["guarantee"], evidence["guaranteeSource"], evidence["annotations"]) == (
            "at-most-once",
            "annotations_trusted",
            {"readOnlyHint": True, "destructiveHint": True},
        )


# --- the worker names what it ignores -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.temporal
def test_maka_worker_json_names_each_server_whose_annotations_it_ignores(
    temporal_server: Any, tmp_path: Path
) -> None:
    servers = {
        name: {
            "command": sys.executable,
            "args": [str(HINT), "--state", str(tmp_path / name)],
            **({"trustAnnotations": True} if name == "vouched" else {}),
        }
        for name in ("liar", "vouched")
    }
    config = write_config(tmp_path / "servers.json", servers)
    home = tmp_path / "home"
    env = _env(home, temporal_server.address)
    worker = WorkerProcess(
        temporal_server,
        home / "ledger.sqlite",
        env["MAKA_TASK_QUEUE"],
        home=home,
        entry=(*WORKER, "--json"),
        extra_env={"MAKA_MCP_CONFIG": str(config)},
    )
    try:
        _until(
            "the ready event", lambda: b'"event": "ready"' in worker.log.read_bytes(), worker.log.read_text
        )
        events = [json.loads(line) for line in worker.log.read_text().splitlines() if line.startswith("{")]
    finally:
        worker.stop()
        for name in ("liar", "vouched"):
            end_servers(tmp_path / name)
    names = [e["event"] for e in events]
    ignored = [e for e in events if e["event"] == "mcp_annotations_ignored"]
    assert ignored == [
        {
            "event": "mcp_annotations_ignored",
            "server": "liar",
            "ignoredHints": {
                "append": {"readOnlyHint": True},
                "clobber": {"readOnlyHint": True, "destructiveHint": True},
                "whisper": {"readOnlyHint": True},
            },
        }
    ], events
    assert names.index("mcp_annotations_ignored") < names.index("ready")


# --- the secret: a server's tool list is redacted before any model sees it -----------------------


class _LeakySecrets(Secrets):
    """The broken variant: a manager that cuts nothing out of what its servers say."""

    def redact(self, text: str) -> str:
        return text


@pytest.fixture
def vendor(monkeypatch: pytest.MonkeyPatch) -> Iterator[WindowedVendor]:
    server = WindowedVendor(10**9)
    monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    yield server
    server.close()


def _catalog_and_request(
    tmp_path: Path, vendor: WindowedVendor, *, leaky: bool
) -> tuple[dict[str, str], dict[str, Any], bytes]:
    """One model step of a session whose worker serves the hint server with ``HINT_TOKEN`` in its env:
    the runtime's tool catalog, the request the vendor received, the ledger's bytes."""
    tmp_path.mkdir()
    state = tmp_path / "state"
    entry = {
        "command": sys.executable,
        "args": [str(HINT), "--state", str(state)],
        "env": {"HINT_TOKEN": CANARY},
    }
    config = load_mcp_config(write_config(tmp_path / "servers.json", {"hint": entry}))
    servers = McpServers(config)
    if leaky:
        servers.secrets = _LeakySecrets(config)
    (tmp_path / "ws").mkdir()
    ws = Workspace.open(tmp_path / "ws")
    db = tmp_path / "ledger.sqlite"
    tools = McpToolset(default_tools(), servers)
    rt = Runtime(LedgerStore.open(db), tools=tools, settings=RuntimeSettings(mcp_config=config))
    ids = RunIds(session_id="s-secret", turn_id="t1", run_id="r1", invocation_id="i1")
    spec = {"kind": "openai", "model": "secret-model"}
    try:
        tools.start()
        assert "mcp__hint__whisper" in rt.tools, servers.tools()
        asyncio.run(
            turn.begin_run(
                rt,
                BeginRunInput(
                    ids=ids, text="turn 1", ts=1, workflow_id="wf", workflow_run_id="wr", task_queue="q",
                    workspace=str(ws.root), workspace_identity=ws.identity, provider=spec,
                ),
            )
        )  # fmt: skip
        asyncio.run(
            model_step.model_step(rt, ModelStepInput(ids=ids, step=0, workspace=str(ws.root), provider=spec))
        )
        catalog = rt.tool_catalog()
    finally:
        tools.close()
        rt.close()
    (request,) = [r.body for r in vendor.requests if r.path.endswith("/chat/completions")]
    return catalog, request, b"".join(p.read_bytes() for p in tmp_path.glob("ledger.sqlite*"))


@pytest.mark.slow
def test_a_servers_secret_in_its_tool_list_never_reaches_the_vendor_or_the_ledger(
    tmp_path: Path, vendor: WindowedVendor
) -> None:
    catalog, request, ledger = _catalog_and_request(tmp_path / "redacted", vendor, leaky=False)
    (whisper,) = [t["function"] for t in request["tools"] if t["function"]["name"] == "mcp__hint__whisper"]
    assert CANARY not in json.dumps(request) and CANARY.encode() not in ledger
    assert whisper["description"] == "Answers ok. Deploy key: [redacted]"
    assert whisper["parameters"]["properties"]["mode"]["description"] == "one of ok, or [redacted]"
    # The negative control: the same server and step with a manager that redacts nothing leaks the
    # secret to the vendor, in the tool list.
    vendor.requests.clear()
    leaked_catalog, leaked, _ = _catalog_and_request(tmp_path / "leaky", vendor, leaky=True)
    assert CANARY in json.dumps(leaked["tools"])
    # A schema without a secret hashes as before (every existing session's catalog still matches);
    # only the schema that held the secret changed its digest.
    changed = {n for n in catalog if catalog[n] != leaked_catalog[n]}
    assert changed == {"mcp__hint__whisper"}, changed


def test_a_tool_whose_name_says_a_secret_is_not_offered(tmp_path: Path) -> None:
    from maka_core.tools.mcp.catalog import offer

    config = load_mcp_config(
        write_config(tmp_path / "servers.json", {"s": {"command": "x", "env": {"T": CANARY}}})
    )

    class Wire:
        name, title, description, annotations = f"get_{CANARY}", None, "d", None
        input_schema: dict[str, Any] = {"type": "object"}

    assert offer("s", config.mcp_servers["s"], Wire(), Secrets(config)) is None
    Wire.name = "get"  # the control: the same tool under a plain name is offered
    assert offer("s", config.mcp_servers["s"], Wire(), Secrets(config)) is not None
