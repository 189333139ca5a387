"""``SessionClient`` refuses what the CLI refuses, with the same codes, before anything is started
or written; ``MakaPlugin`` refuses a bad setting by name before its worker polls.

Each bad start is given to ``maka session start`` (Click's runner) and to ``SessionClient.start``:
the codes must be equal, and neither leaves a ledger, a policy or a workspace marker behind. The
client here points at an address where nothing listens, so a call that got past its checks would
say ``temporal_unavailable`` instead (the negative control: valid input does say that).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel
from temporalio.client import Client
from temporalio.worker import Worker

from maka_core.tools import FunctionTool, ToolContext, tool
from maka_temporal import MakaPlugin, SessionClient, SessionError
from maka_temporal.workers.cli.app import maka
from maka_temporal.workers.host.devserver import free_port
from tests.temporal_support import tool_step, write_script


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str | None]:
    values: dict[str, str | None] = {
        "MAKA_HOME": str(tmp_path / "home"),
        "TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",
        "MAKA_DB": None,
        "MAKA_TASK_QUEUE": None,
        "MAKA_POLICY": None,
    }
    for key, value in values.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    return values


def _cli_code(env: dict[str, str | None], args: list[str]) -> str:
    result = CliRunner().invoke(maka, ["session", "start", "--json", *args], env=env, catch_exceptions=False)
    assert result.exit_code == 2, result.output
    return str(json.loads(result.stdout)["code"])


def _bad_starts(tmp: Path) -> dict[str, tuple[list[str], dict[str, Any]]]:
    ws = tmp / "ws"
    ws.mkdir(exist_ok=True)
    good = write_script(tmp / "good.json", [tool_step(("read_file", {"path": "a"}), text="x")])
    bad = tmp / "bad.json"
    bad.write_text("{not json")
    policy = tmp / "policy.json"
    policy.write_text('{"policyVersion": "1", "mutations": "sometimes"}')
    base = {"workspace": ws, "script": good}
    return {
        "empty message": (["--workspace", str(ws), "--script", str(good), "  "], {**base, "message": "  "}),
        "bad session id": (
            ["--workspace", str(ws), "--script", str(good), "--session-id", "../x", "go"],
            {**base, "message": "go", "session_id": "../x"},
        ),
        "malformed script": (
            ["--workspace", str(ws), "--script", str(bad), "go"],
            {"workspace": ws, "script": bad, "message": "go"},
        ),
        "no workspace": (
            ["--workspace", str(tmp / "nope"), "--script", str(good), "go"],
            {"workspace": tmp / "nope", "script": good, "message": "go"},
        ),
        "bad policy": (
            ["--workspace", str(ws), "--script", str(good), "--policy", str(policy), "go"],
            {**base, "message": "go", "policy": policy},
        ),
        "script and model": (
            ["--workspace", str(ws), "--script", str(good), "--model", "openai:x", "go"],
            {**base, "message": "go", "model": "openai:x"},
        ),
        "step timeout": (
            ["--workspace", str(ws), "--script", str(good), "--step-timeout", "0", "go"],
            {**base, "message": "go", "step_timeout": 0.0},
        ),
        "unknown tool group": (
            ["--workspace", str(ws), "--script", str(good), "--offer", "builtins,foo:bar", "go"],
            {**base, "message": "go", "offer": ["builtins", "foo:bar"]},
        ),
        "no such MELRA tool": (
            ["--workspace", str(ws), "--script", str(good), "--offer", "melra_plot", "go"],
            {**base, "message": "go", "offer": ["melra_plot"]},
        ),
        "empty tool set": (
            ["--workspace", str(ws), "--script", str(good), "--offer", " , ", "go"],
            {**base, "message": "go", "offer": [""]},
        ),
    }


@pytest.mark.asyncio(loop_scope="session")
async def test_every_bad_start_is_refused_with_the_clis_code_and_nothing_written(
    env: dict[str, str | None], tmp_path: Path
) -> None:
    home = Path(str(env["MAKA_HOME"]))
    client = await Client.connect(str(env["TEMPORAL_ADDRESS"]), lazy=True)
    sessions = SessionClient(client)
    for case, (args, kwargs) in _bad_starts(tmp_path).items():
        cli = _cli_code(env, args)
        with pytest.raises(SessionError) as err:
            await sessions.start(**kwargs)
        assert err.value.code == cli, (case, err.value.code, cli)
        assert cli != "temporal_unavailable", case
        assert not (home / "ledger.sqlite").exists(), case
        assert not (tmp_path / "ws" / ".maka").exists(), case
    # Negative control: valid input gets past every check and reaches for the server.
    with pytest.raises(SessionError) as err:
        await sessions.start(workspace=tmp_path / "ws", message="go", script=tmp_path / "good.json")
    assert err.value.code == "temporal_unavailable"


@pytest.mark.asyncio(loop_scope="session")
async def test_unknown_sessions_and_cancel_are_refused_by_code(
    env: dict[str, str | None], tmp_path: Path
) -> None:
    sessions = SessionClient(None)
    with pytest.raises(SessionError) as err:
        await sessions.status("nobody")
    assert err.value.code == "ledger_not_found"
    with pytest.raises(SessionError) as err:
        await sessions.approve("nobody", "appr-1", phrase="APPROVE 000000000000")
    assert err.value.code == "ledger_not_found"
    with pytest.raises(SessionError) as err:
        await sessions.show("nobody")
    assert err.value.code == "ledger_not_found"
    with pytest.raises(SessionError) as err:
        await sessions.cancel("nobody")
    assert err.value.code == "temporal_unavailable"  # cancel is an Update: it needs the server
    with pytest.raises(SessionError) as err:
        SessionClient(None, task_queue="")
    assert err.value.code == "config_invalid"


class _EchoArgs(BaseModel):
    text: str


def _echo(args: _EchoArgs, ctx: ToolContext) -> str:
    """Echo a text."""
    return args.text


def _Echo(name: str = "echo") -> FunctionTool:
    """A fresh ``@tool`` (a new object each call, so two of them are two tools of one name)."""
    made: FunctionTool = tool(_echo, name=name, guarantee="read-only")
    return made


def test_the_plugin_refuses_a_bad_setting_by_name(env: dict[str, str | None]) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"host": "two words"}, "MAKA_HOST"),
        ({"tool_heartbeat_timeout": -1.0}, "MAKA_TOOL_HEARTBEAT_TIMEOUT"),
        ({"tools": [object()]}, "tools"),
        ({"tools": [_Echo(), _Echo()]}, "tools"),
    ]
    for kwargs, setting in cases:
        with pytest.raises(SessionError) as err:
            MakaPlugin(**kwargs)
        assert (err.value.code, err.value.detail.get("setting")) == ("config_invalid", setting), kwargs
    with pytest.raises(SessionError) as err:
        MakaPlugin(mcp_config="no-such-servers.json")
    assert err.value.code == "mcp_config_invalid"
    MakaPlugin(tools=[_Echo()])  # negative control: a good tool is taken


@pytest.mark.asyncio(loop_scope="session")
async def test_a_tool_that_takes_a_built_in_name_or_a_bad_ledger_is_refused_before_polling(
    env: dict[str, str | None], temporal_client: Client, tmp_path: Path, task_queue: str
) -> None:
    client = temporal_client
    shadow = _Echo("bash")
    with pytest.raises(SessionError) as err:
        Worker(client, task_queue=task_queue, plugins=[MakaPlugin(tools=[shadow])])
    assert (err.value.code, err.value.detail.get("tool")) == ("tools_invalid", "bash")  # as --tools says
    folder = tmp_path / "a-directory"
    folder.mkdir()
    with pytest.raises(SessionError) as err:
        Worker(client, task_queue=task_queue, plugins=[MakaPlugin(ledger=folder)])
    assert err.value.code == "store_unreadable"
    plugin = MakaPlugin(ledger=tmp_path / "ledger.sqlite", tools=[_Echo()])
    worker = Worker(client, task_queue=task_queue, plugins=[plugin])  # negative control: this one is built
    assert "echo" in plugin.runtime.tools and "bash" in plugin.runtime.tools
    assert worker.config(active_config=True)["identity"].rsplit("#", 1)[1] != "unknown"
    plugin.close()


@pytest.mark.temporal
@pytest.mark.asyncio(loop_scope="session")
async def test_a_session_through_the_client_start_wait_send_show_audit(
    temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's answers on a real session, served by a plain ``Worker`` with ``MakaPlugin``
    (the session is pinned to the machine's host, as from the CLI: the plugin serves its queue)."""
    monkeypatch.setenv("MAKA_HOME", str(tmp_path / "home"))
    db = tmp_path / "ledger.sqlite"
    script = write_script(
        tmp_path / "s.json",
        [tool_step(("write_file", {"path": "a.txt", "content": "A\n"}), text="writing"), {"text": "done"},
         {"text": "again"}],
    )  # fmt: skip
    sessions = SessionClient(temporal_client, ledger=db, task_queue=task_queue)
    async with Worker(temporal_client, task_queue=task_queue, plugins=[MakaPlugin(ledger=db)]):
        started = await sessions.start(workspace=ws_dir, message="write a", script=script, session_id="lib-1")
        assert started.session_id == "lib-1" and started.run_id.startswith("run-")
        status = await sessions.wait("lib-1", started.run_id)
        assert (status.state, status.park_reason) == ("idle", None)
        assert [(o.tool_name, o.status, o.is_error) for o in status.operations] == [
            ("write_file", "completed", False)
        ]
        assert (
            status.config is not None
            and status.config["policyDigest"] == status.raw["config"]["policyDigest"]
        )
        again = await sessions.send("lib-1", "once more")
        assert (await sessions.wait("lib-1")).state == "idle" and again.run_id != started.run_id
        with pytest.raises(SessionError) as err:
            await sessions.start(workspace=ws_dir, message="x", script=script, session_id="lib-1")
        assert err.value.code == "session_policy_conflict" or err.value.code == "session_exists"
        shown = await sessions.show("lib-1")
        assert "model: done" in shown.lines and "user: once more" in shown.lines
        audited = await sessions.audit("lib-1")
        assert audited.ok, audited.raw
        with pytest.raises(SessionError) as err:
            await sessions.resume("lib-1")
        assert (
            err.value.code == "session_busy"
        )  # its execution is open (idle): nothing to resume, as the CLI says
    assert (ws_dir / "a.txt").read_text() == "A\n"


@pytest.mark.temporal
@pytest.mark.asyncio(loop_scope="session")
async def test_without_its_host_queue_the_same_session_parks_on_its_host(
    temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control of the flow test above: the plugin made to serve no host queue leaves the
    session's tool unstarted, and the turn parks ``workspace_host_unavailable`` after its host
    wait (the plugin's host worker is what ran the tool there)."""
    monkeypatch.setenv("MAKA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MAKA_HOST_WAIT", "1")
    db = tmp_path / "ledger.sqlite"
    script = write_script(
        tmp_path / "s.json", [tool_step(("write_file", {"path": "a.txt", "content": "A\n"}))]
    )
    sessions = SessionClient(temporal_client, ledger=db, task_queue=task_queue)
    async with Worker(
        temporal_client, task_queue=task_queue, plugins=[MakaPlugin(ledger=db, serve_host_queue=False)]
    ):
        started = await sessions.start(workspace=ws_dir, message="write a", script=script)
        status = await sessions.wait(started.session_id, started.run_id, timeout=60)
    assert (status.state, status.park_reason) == ("parked", "workspace_host_unavailable")
    assert not (ws_dir / "a.txt").exists()


@pytest.mark.temporal
@pytest.mark.asyncio(loop_scope="session")
async def test_a_parked_child_session_says_parked_and_carries_no_text(
    temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child whose turn parks returns ``outcome="parked"`` and no ``text``, not ``failed`` and
    the model's interim line. The park: a policy capping the turn at 100 tokens, a first step of 110
    that says an interim line and calls ``list_dir``; the second step parks ``usage_limit_reached``
    before its call, and the turn ends (a park on the host, ``workspace_host_unavailable``, waits
    in the open child for ``maka resume`` and returns to no parent). Control: the ledger's reply for
    the same run (what the result carried before) is that interim line and ``failed``, so there was
    a half sentence to withhold; and the same child without the cap runs to ``completed``."""
    from activities.child import final_text
    from maka_core.store.writer import LedgerStore
    from maka_temporal import SessionResult
    from tests.children.child_session_workflow import PolicyChildSessionWorkflow

    monkeypatch.setenv("MAKA_HOME", str(tmp_path / "home"))
    db = tmp_path / "ledger.sqlite"
    interim = "Step 1: listing the workspace."
    first = tool_step(("list_dir", {"path": "."}), text=interim)
    first["usage"] = {"input": 80, "output": 30}
    script = write_script(tmp_path / "s.json", [first, {"text": "done"}])
    capped = tmp_path / "capped.json"
    capped.write_text(json.dumps({"usage": {"maxTokensPerTurn": 100}}))
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({}))
    plugin = MakaPlugin(ledger=db)
    done: dict[str, SessionResult] = {}
    async with Worker(
        temporal_client, task_queue=task_queue, workflows=[PolicyChildSessionWorkflow], plugins=[plugin]
    ):
        for sid, policy in (("parked-child-1", capped), ("parked-child-2", plain)):
            done[sid] = await asyncio.wait_for(
                temporal_client.execute_workflow(
                    PolicyChildSessionWorkflow.run,
                    args=[str(ws_dir), str(script), sid, str(policy)],
                    id=f"p-{sid}-{task_queue}",
                    task_queue=task_queue,
                    result_type=SessionResult,
                ),
                timeout=60,
            )
    result = done["parked-child-1"]
    assert (result.state, result.park_reason) == ("parked", "usage_limit_reached"), result
    assert (result.outcome, result.text) == ("parked", None), result
    assert result.run_id is not None
    with LedgerStore.open(db) as store:
        header = store.get_run(result.run_id)
        said = final_text(store.events(session_id="parked-child-1"), result.run_id)
    assert said == interim and header is not None and header.status == "failed", (said, header)
    control = done["parked-child-2"]
    assert (control.state, control.outcome, control.text) == ("idle", "completed", "done"), control


def test_the_plugin_gives_a_client_the_pydantic_payload_converter_and_keeps_the_rest() -> None:
    import dataclasses

    from temporalio.contrib.pydantic import PydanticPayloadConverter
    from temporalio.converter import DataConverter, PayloadCodec

    class Codec(PayloadCodec):
        async def encode(self, payloads: Any) -> Any:
            return payloads

        async def decode(self, payloads: Any) -> Any:
            return payloads

    plugin = MakaPlugin()
    mine = dataclasses.replace(DataConverter.default, payload_codec=Codec())
    config = plugin.configure_client({"data_converter": mine})  # type: ignore[typeddict-item]
    given = config["data_converter"]
    assert (
        given.payload_converter_class is PydanticPayloadConverter
        and given.payload_codec is mine.payload_codec
    )


@pytest.mark.temporal
@pytest.mark.asyncio(loop_scope="session")
async def test_a_child_session_id_is_taken_once(
    temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_session`` with a session id already taken is refused ``session_exists`` (the first
    session is untouched); the first run returned its result."""
    from temporalio.client import WorkflowFailureError
    from temporalio.exceptions import ApplicationError

    from maka_temporal import SessionResult
    from tests.children.child_session_workflow import ChildSessionWorkflow

    monkeypatch.setenv("MAKA_HOME", str(tmp_path / "home"))
    db = tmp_path / "ledger.sqlite"
    script = write_script(tmp_path / "s.json", [{"text": "hello"}])
    plugin = MakaPlugin(ledger=db)
    args = [str(ws_dir), str(script), "child-1"]
    async with Worker(
        temporal_client, task_queue=task_queue, workflows=[ChildSessionWorkflow], plugins=[plugin]
    ):
        first = await temporal_client.execute_workflow(
            ChildSessionWorkflow.run,
            args=args,
            id=f"p1-{task_queue}",
            task_queue=task_queue,
            result_type=SessionResult,
        )
        assert (first.session_id, first.state, first.text) == ("child-1", "idle", "hello")
        assert first.outcome == "completed"  # from the run's header (a cancelled turn: "cancelled")
        with pytest.raises(WorkflowFailureError) as err:
            await temporal_client.execute_workflow(
                ChildSessionWorkflow.run, args=args, id=f"p2-{task_queue}", task_queue=task_queue
            )
        assert isinstance(err.value.cause, ApplicationError) and err.value.cause.type == "session_exists"
        status = await SessionClient(temporal_client, ledger=db).status("child-1")
        assert status.state == "idle" and len(status.turns) == 1


class _WatchedPlugin(MakaPlugin):
    """MakaPlugin as shipped, with its host worker and its ledger's close in view of the test."""

    def __init__(self, **kwargs: Any) -> None:
        self.pollers: list[Worker] = []
        #: At the ledger's close: whether each poller was still running.
        self.running_at_close: list[bool] | None = None

        def make(store: Any, settings: Any) -> Any:
            from maka_temporal.workers.host.worker import default_runtime

            close = store.close

            def watched_close() -> None:
                self.running_at_close = [p.is_running for p in self.pollers]
                close()

            store.close = watched_close
            return default_runtime(store, settings)

        super().__init__(make_runtime=make, **kwargs)

    def _host_worker(self, worker: Worker, served: Any) -> Worker:
        host = super()._host_worker(worker, served)
        self.pollers.append(host)
        return host


@pytest.mark.temporal
@pytest.mark.asyncio(loop_scope="session")
async def test_cancelling_the_worker_task_stops_both_pollers_before_the_ledger_closes(
    temporal_client: Client, tmp_path: Path, task_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (or a cancelled TaskGroup) cancels the task running ``worker.run()``: the session and
    host pollers stop, and only then the activities and the ledger close. Before the fix both
    pollers went on polling over a closed ledger."""
    import asyncio

    monkeypatch.setenv("MAKA_HOME", str(tmp_path / "home"))
    plugin = _WatchedPlugin(ledger=tmp_path / "ledger.sqlite", repair=False, host="box1")
    worker = Worker(temporal_client, task_queue=task_queue, plugins=[plugin])
    plugin.pollers.append(worker)
    task = asyncio.create_task(worker.run())
    deadline = asyncio.get_running_loop().time() + 30
    while not (len(plugin.pollers) == 2 and all(p.is_running for p in plugin.pollers)):
        assert asyncio.get_running_loop().time() < deadline, f"pollers never ran: {plugin.pollers}"
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 30)
    assert plugin.running_at_close == [False, False], "the ledger closed under a running poller"
    assert not any(p.is_running for p in plugin.pollers)
    Worker(temporal_client, task_queue=task_queue, plugins=[plugin])  # it can serve again
    assert plugin.store.health.ledger_id  # a fresh ledger handle, not the closed one
    plugin.close()


@pytest.mark.temporal
@pytest.mark.asyncio(loop_scope="session")
async def test_a_child_session_offers_the_set_it_was_given(
    temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_session(offer=["read_file"])``: the set is in the child's recorded config, and its
    ``list_dir`` call is refused before T1 (``tool_not_offered``). Control: no set, the call runs."""
    from maka_core.runtime.lost_run import session_record
    from maka_core.store.writer import LedgerStore
    from maka_temporal import SessionResult
    from tests.children.child_session_workflow import OfferedChildSessionWorkflow

    monkeypatch.setenv("MAKA_HOME", str(tmp_path / "home"))
    db = tmp_path / "ledger.sqlite"
    steps = [tool_step(("list_dir", {"path": "."}), text="x"), {"text": "done"}]
    script = write_script(tmp_path / "s.json", steps)
    plugin = MakaPlugin(ledger=db)
    results: dict[str, Any] = {}
    async with Worker(
        temporal_client, task_queue=task_queue, workflows=[OfferedChildSessionWorkflow], plugins=[plugin]
    ):
        for sid, offer in (("offered-1", ["read_file"]), ("offered-2", None)):
            done = await temporal_client.execute_workflow(
                OfferedChildSessionWorkflow.run,
                args=[str(ws_dir), str(script), sid, offer],
                id=f"p-{sid}-{task_queue}",
                task_queue=task_queue,
                result_type=SessionResult,
            )
            assert done.state == "idle", done
            with LedgerStore.open(db) as store:
                events = store.events(session_id=sid)
            record = session_record(events)
            responses = [
                e.content for e in events if e.content is not None and e.content.kind == "function_response"
            ]
            dispatched = [e for e in events if e.actions is not None and e.actions.tool_dispatch is not None]
            results[sid] = (record.config.tool_set if record else "no record", responses, dispatched)
    tool_set, responses, dispatched = results["offered-1"]
    assert tool_set == ("read_file",)
    assert [r.result["value"]["code"] for r in responses] == ["tool_not_offered"] and not dispatched
    tool_set, responses, dispatched = results["offered-2"]
    assert tool_set is None and len(dispatched) == 1 and not responses[0].is_error


@pytest.mark.temporal
@pytest.mark.asyncio(loop_scope="session")
async def test_a_session_offering_a_tool_no_worker_serves_parks_tool_set_unavailable(
    temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``offer=["builtins", "lookup"]`` on a worker that serves no ``lookup``: the step fails
    non-retryable and the turn parks ``tool_set_unavailable``, nothing committed for the model (no
    call, no result). Control: ``offer=["builtins"]`` runs the same script to idle."""
    from maka_core.store.writer import LedgerStore
    from maka_temporal import SessionResult
    from tests.children.child_session_workflow import OfferedChildSessionWorkflow

    monkeypatch.setenv("MAKA_HOME", str(tmp_path / "home"))
    db = tmp_path / "ledger.sqlite"
    script = write_script(
        tmp_path / "s.json", [tool_step(("list_dir", {"path": "."}), text="x"), {"text": "done"}]
    )
    plugin = MakaPlugin(ledger=db)
    async with Worker(
        temporal_client, task_queue=task_queue, workflows=[OfferedChildSessionWorkflow], plugins=[plugin]
    ):
        done: dict[str, Any] = {}
        for sid, offer in (("unserved-1", ["builtins", "lookup"]), ("unserved-2", ["builtins"])):
            done[sid] = await temporal_client.execute_workflow(
                OfferedChildSessionWorkflow.run,
                args=[str(ws_dir), str(script), sid, offer],
                id=f"p-{sid}-{task_queue}",
                task_queue=task_queue,
                result_type=SessionResult,
            )
    with LedgerStore.open(db) as store:
        parked = store.events(session_id="unserved-1")
        control = store.events(session_id="unserved-2")
    assert (done["unserved-1"].state, done["unserved-1"].park_reason) == ("parked", "tool_set_unavailable")
    assert not [
        e
        for e in parked
        if e.content is not None and e.content.kind in ("function_call", "function_response")
    ]
    assert done["unserved-2"].state == "idle", done["unserved-2"]
    assert any(e.content is not None and e.content.kind == "function_response" for e in control)


def test_a_new_sessions_settings_are_declared_once() -> None:
    """``SessionClient.start``'s keywords are ``SessionStart``'s fields (the model the CLI and a
    child session build too), with the same defaults, plus ``host`` and ``accept_timeout``; a
    value of the wrong type is ``config_invalid`` naming it. Control: a field the model lacks is
    refused, so a keyword added to ``start`` alone would fail the first assertion."""
    import inspect

    from pydantic_core import PydanticUndefined

    from maka_core.errors import MakaError
    from maka_temporal.workers.client.session_start import SessionStart

    params = inspect.signature(SessionClient.start).parameters
    keywords = {n: p.default for n, p in params.items() if n != "self"}
    fields = {n: f.default for n, f in SessionStart.model_fields.items()}
    assert {n: d for n, d in keywords.items() if n not in ("host", "accept_timeout")} == {
        n: (inspect.Parameter.empty if d is PydanticUndefined else d) for n, d in fields.items()
    }
    with pytest.raises(MakaError) as wrong:
        SessionStart.of(workspace=".", message="go", max_steps="many")
    assert wrong.value.code == "config_invalid" and wrong.value.detail["setting"] == "max_steps"
    with pytest.raises(MakaError) as extra:
        SessionStart.of(workspace=".", message="go", colour="red")
    assert extra.value.detail["setting"] == "colour"
    # Strict: no lax coercion (a lax model took True as 1 step and "7" as 7).
    for setting, value in (("max_steps", True), ("max_steps", "7"), ("unhinged", 1), ("step_timeout", "5")):
        with pytest.raises(MakaError) as coerced:
            SessionStart.of(workspace=".", message="go", **{setting: value})
        assert (coerced.value.code, coerced.value.detail["setting"]) == ("config_invalid", setting), value
    fine = SessionStart.of(workspace=".", message="go", step_timeout=5, offer=["user"], on_behalf_of=["a"])
    assert (fine.step_timeout, fine.offer, fine.on_behalf_of) == (5.0, ("user",), ("a",))


def test_a_clients_own_tools_are_checked_as_the_plugin_checks_them(
    env: dict[str, str | None], tmp_path: Path
) -> None:
    """``SessionClient(tools=)`` refuses a built-in's name and a duplicate ``tools_invalid`` in
    ``check_local``, before anything connects (review L3). Control: a good tool is taken."""
    ledger = tmp_path / "ledger.sqlite"
    for bad, name in (([_Echo("bash")], "bash"), ([_Echo(), _Echo()], None)):
        with pytest.raises(SessionError) as err:
            SessionClient(None, ledger=ledger, tools=bad).check_local(tools=True)
        assert err.value.code == "tools_invalid", (err.value.code, err.value.detail)
        if name is not None:
            assert err.value.detail.get("tool") == name, err.value.detail
    with pytest.raises(SessionError) as err:  # the good tool passes the tools and meets the ledger
        SessionClient(None, ledger=ledger, tools=[_Echo()]).check_local(tools=True)
    assert err.value.code == "ledger_not_found", err.value.code
