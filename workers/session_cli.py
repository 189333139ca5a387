"""``maka worker``, ``maka dev``, ``maka demo`` and ``maka session start|send|status|show``.

Every command reads ``maka_core.settings`` (``MAKA_HOME``, ``MAKA_DB``, ``MAKA_TASK_QUEUE``...; flags
win), the standard Temporal client settings (``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, envconfig
profiles; ``--address`` and ``--namespace`` override them) and ``--db``. Input is validated before
anything is started or written. ``--json`` output is for scripts; progress goes to stderr. Exit
codes: 0 settled idle, 1 the turn parked or failed, 2 refused (an unknown session, a bad message or
script, no server, a wait that timed out).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import click

from maka_core.errors import ConfigError, MakaError
from maka_core.settings import MakaSettings
from workers.cli_base import (
    console,
    db_option,
    ensure_utf8,
    finish,
    json_option,
    open_ledger,
    print_json,
    print_line,
    run_async,
    settings,
    stdout_is_tty,
    temporal_options,
)
from workers.session_wait import wait_settled

__all__ = ["COMMANDS", "query_status", "send_message", "start_session", "wait_settled"]


def worker_settings(s: MakaSettings) -> Any:
    """The worker's activity settings from the one settings model."""
    from activities import WorkerSettings

    return WorkerSettings(
        tool_heartbeat_timeout_s=s.tool_heartbeat_timeout,
        tool_start_to_close_timeout_s=s.tool_start_to_close_timeout,
        provider_call_log=s.provider_call_log,
    )


heartbeat_option = click.option(
    "--tool-heartbeat-timeout",
    type=float,
    default=None,
    metavar="SECONDS",
    help="tool activities' heartbeat timeout (MAKA_TOOL_HEARTBEAT_TIMEOUT; default 20)",
)
wait_timeout_option = click.option(
    "--wait-timeout",
    type=float,
    default=None,
    metavar="SECONDS",
    help="give up waiting after this long, keeping the session (MAKA_WAIT_TIMEOUT; default 600)",
)


# --- worker / dev ------------------------------------------------------------------------------


@click.command("worker")
@db_option
@temporal_options()
@heartbeat_option
@click.option("--no-repair", is_flag=True, help="skip startup repair (tests only)")
@json_option("lifecycle events as JSON lines on stderr")
def cmd_worker(
    db: str | None,
    address: str | None,
    namespace: str | None,
    task_queue: str | None,
    tool_heartbeat_timeout: float | None,
    no_repair: bool,
    as_json: bool,
) -> None:
    """Run a worker: startup repair, then poll."""
    from workers.client import connect
    from workers.worker import serve

    s = settings(db=db, task_queue=task_queue, tool_heartbeat_timeout=tool_heartbeat_timeout)
    open_ledger(s.ledger, create=True).close()  # refuse a bad --db before connecting

    async def main() -> int:
        client = await connect(address, namespace)
        await serve(
            client,
            s.ledger,
            s.task_queue,
            settings=worker_settings(s),
            repair=not no_repair,
            json_events=as_json,
        )
        return 0

    finish(run_async(main()))


@click.command("dev")
@db_option
@temporal_options()
@click.option("--port", type=click.IntRange(1, 65535), default=7233, help="frontend gRPC port (default 7233)")
@click.option(
    "--ui-port", type=click.IntRange(1, 65535), default=None, help="Web UI port (default: port + 1000)"
)
@click.option("--no-worker", is_flag=True, help="bring up the server alone")
@heartbeat_option
@json_option("server and worker lifecycle events as JSON lines")
def cmd_dev(
    db: str | None,
    address: str | None,
    namespace: str | None,
    task_queue: str | None,
    port: int,
    ui_port: int | None,
    no_worker: bool,
    tool_heartbeat_timeout: float | None,
    as_json: bool,
) -> None:
    """Run the embedded Temporal dev server (+ a worker)."""
    from workers import devserver
    from workers.client import connect
    from workers.worker import serve

    s = settings(db=db, task_queue=task_queue, tool_heartbeat_timeout=tool_heartbeat_timeout)
    if not no_worker:
        open_ledger(s.ledger, create=True).close()
    server = devserver.start(
        port=port,
        ui=True,
        ui_port=ui_port,
        db_file=s.home / "temporal.db",
        log_path=s.home / "logs" / "temporal.log",
    )
    if as_json:
        print_line(
            {
                "event": "server",
                "address": server.address,
                "ui": server.ui_address,
                "database": str(server.db_file),
            }
        )
    else:
        click.echo(f"Temporal dev server: {server.address}  (database {server.db_file})")
        click.echo(f"Temporal UI:         {server.ui_address}")

    async def main() -> int:
        if no_worker:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            if not as_json:
                click.echo("maka dev: server only (--no-worker); Ctrl-C to stop")
            await stop.wait()
            return 0
        client = await connect(server.address, namespace)
        await serve(
            client, s.ledger, s.task_queue, settings=worker_settings(s), out=sys.stdout, json_events=as_json
        )
        return 0

    try:
        code = run_async(main())
    finally:
        server.stop()  # before the process leaves: never orphan the server
    finish(code)


@click.command("demo")
@db_option
@temporal_options()
@json_option()
def cmd_demo(
    db: str | None, address: str | None, namespace: str | None, task_queue: str | None, as_json: bool
) -> None:
    """Run a scripted session on a sample workspace."""
    from workers import demo  # imported late: the demo module builds on this one

    finish(demo.run_demo(settings(db=db), address=address, namespace=namespace, as_json=as_json))


# --- the Temporal side of a session ------------------------------------------------------------


async def start_session(
    client: Any,
    *,
    workspace: Path,
    provider: dict[str, Any],
    task_queue: str,
    message: str,
    session_id: str | None = None,
    continue_as_new_after: int | None = None,
    continue_as_new_after_steps: int | None = None,
    model_step_mode: str = "local",
    task_timeout: Any = None,
    accept_timeout: float | None = None,
) -> tuple[str, Any]:
    """Start a session workflow and send its first message; returns (session id, TurnAccepted).

    Raises:
        MakaError: ``session_exists`` (the id is taken), ``wait_timeout`` (no worker accepted the
            message within ``accept_timeout``; the session keeps it), workspace codes.
    """
    from temporalio.exceptions import WorkflowAlreadyStartedError

    from maka_core.workspace import Workspace
    from workflows.contracts import SessionInput, workflow_id_for
    from workflows.session import SessionWorkflow, initial_search_attributes

    ws = Workspace.open(workspace, create=True)
    if task_timeout is None:
        env_timeout = settings().workflow_task_timeout
        if env_timeout is not None:
            # Drills: a killed worker's in-flight workflow task (a local model step) is retried after this.
            task_timeout = timedelta(seconds=env_timeout)
    session_id = session_id or f"sess-{uuid.uuid4()}"
    inp = SessionInput(
        session_id=session_id,
        workspace=str(ws.root),
        workspace_identity=ws.identity,
        provider=provider,
        task_queue=task_queue,
        continue_as_new_after_turns=continue_as_new_after,
        continue_as_new_after_steps=continue_as_new_after_steps,
        model_step_mode=model_step_mode,
    )
    try:
        await client.start_workflow(
            SessionWorkflow.run,
            inp,
            id=workflow_id_for(session_id),
            task_queue=task_queue,
            search_attributes=initial_search_attributes(session_id),
            task_timeout=task_timeout,
        )
    except WorkflowAlreadyStartedError:
        raise MakaError(
            "session_exists", f"session {session_id} already exists", sessionId=session_id
        ) from None
    accepted = await send_message(
        client, session_id, message, accept_timeout=accept_timeout, task_queue=task_queue
    )
    return session_id, accepted


async def send_message(
    client: Any,
    session_id: str,
    message: str,
    *,
    accept_timeout: float | None = None,
    task_queue: str | None = None,
) -> Any:
    """Send one message (the ``send_message`` Update); returns ``TurnAccepted``.

    Raises:
        MakaError: the validator's refusal (``session_parked``, ``turn_in_flight``...),
            ``session_not_found``, ``temporal_unavailable``, or ``wait_timeout``.
    """
    from workflows.contracts import SEND_MESSAGE, SendMessage, TurnAccepted, workflow_id_for

    from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError

    handle = client.get_workflow_handle(workflow_id_for(session_id))
    update = handle.execute_update(SEND_MESSAGE, SendMessage(text=message), result_type=TurnAccepted)
    try:
        if accept_timeout is None:
            return await update
        return await asyncio.wait_for(update, accept_timeout)
    except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
        # Cancelled by our timeout, or the server's own RPC deadline: nobody accepted it in time.
        where = f" on task queue {task_queue!r}" if task_queue else ""
        raise MakaError(
            "wait_timeout",
            f"no worker accepted the message within {accept_timeout or 0:.0f}s "
            f"(is `maka worker` running{where}?); the session keeps the message for when one polls",
            sessionId=session_id,
        ) from None
    except MakaError:
        raise
    except Exception as exc:
        code, text = update_error(exc)
        # A failed update leaves a core RPC callback in flight for a moment; leaving the process
        # under it can crash it at finalization (seen as SIGSEGV/SIGABRT).
        await asyncio.sleep(0.2)
        raise MakaError(code, text, sessionId=session_id) from None


async def query_status(client: Any, session_id: str) -> Any:
    from workflows.contracts import STATUS_QUERY, SessionStatus, workflow_id_for

    handle = client.get_workflow_handle(workflow_id_for(session_id))
    return await handle.query(STATUS_QUERY, result_type=SessionStatus)


def update_error(exc: BaseException) -> tuple[str, str]:
    """A stable snake_case code for an Update or RPC failure."""
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.exceptions import ApplicationError
    from temporalio.service import RPCError, RPCStatusCode

    # The validator's refusal types (SessionParked -> session_parked, TurnInFlight ->
    # turn_in_flight, ...) and the server's answers.
    if isinstance(exc, WorkflowUpdateFailedError) and isinstance(exc.cause, ApplicationError):
        return _snake(exc.cause.type or "update_rejected"), exc.cause.message
    if isinstance(exc, RPCError) and exc.status == RPCStatusCode.NOT_FOUND:
        return "session_not_found", str(exc)
    if isinstance(exc, RPCError):
        return "temporal_unavailable", str(exc)
    return _snake(type(exc).__name__), str(exc)


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(name))


# --- session commands --------------------------------------------------------------------------


@click.group("session")
def session() -> None:
    """Start, message and inspect sessions."""


def _message(text: str) -> str:
    ensure_utf8(text, "message")
    if not text.strip():
        raise MakaError("empty_message", "the message is empty")
    return text


def _provider_spec(script: Path | None, model: str | None) -> dict[str, Any]:
    from maka_core.providers.scripted import ScriptedProvider

    if script is not None and model is not None:
        raise ConfigError("config_invalid", "give either --script or --model")
    if script is not None:
        try:
            ScriptedProvider.from_file(script)  # the whole script, before anything starts
        except RecursionError:
            raise ConfigError("script_invalid", f"{script} is nested too deeply", path=str(script)) from None
        return {"kind": "script", "path": str(script.resolve())}
    if not model or not model.strip():
        raise ConfigError("config_invalid", "give --script FILE or --model NAME")
    return {"kind": "openai", "model": model}


def _workspace(path: Path) -> Path:
    # The same codes Workspace.open uses, checked before the marker file is written.
    if not path.exists():
        raise ConfigError("workspace_not_found", f"no workspace at {path}", path=str(path))
    if not path.is_dir():
        raise ConfigError("invalid_workspace", f"{path} is not a directory", path=str(path))
    return path


@session.command("start")
@db_option
@temporal_options()
@click.option("--workspace", required=True, type=click.Path(path_type=Path))
@click.option(
    "--script", type=click.Path(path_type=Path), default=None, help="scripted provider: a JSON script file"
)
@click.option("--model", default=None, help="OpenAI-compatible model name (OPENAI_BASE_URL, OPENAI_API_KEY)")
@click.option("--session-id", default=None, hidden=True)
@click.option(
    "--continue-as-new-after",
    type=click.IntRange(min=1),
    default=None,
    metavar="TURNS",
    help="continue-as-new after this many turns (default: when Temporal suggests)",
)
@click.option("--model-step-mode", type=click.Choice(["local", "activity"]), default="local")
@click.option("--wait", is_flag=True, help="wait until the turn settles")
@wait_timeout_option
@json_option()
@click.argument("message")
def cmd_start(
    db: str | None,
    address: str | None,
    namespace: str | None,
    task_queue: str | None,
    workspace: Path,
    script: Path | None,
    model: str | None,
    session_id: str | None,
    continue_as_new_after: int | None,
    model_step_mode: str,
    wait: bool,
    wait_timeout: float | None,
    as_json: bool,
    message: str,
) -> None:
    """Start a session and send its first message."""
    from workers.client import connect

    s = settings(db=db, task_queue=task_queue, wait_timeout=wait_timeout)
    text = _message(message)
    provider = _provider_spec(script, model)
    _workspace(workspace)

    async def main() -> int:
        client = await connect(address, namespace)
        sid, accepted = await start_session(
            client,
            workspace=workspace,
            provider=provider,
            task_queue=s.task_queue,
            message=text,
            session_id=session_id,
            continue_as_new_after=continue_as_new_after,
            model_step_mode=model_step_mode,
            accept_timeout=s.wait_timeout,
        )
        return await _after_send(client, s, sid, accepted, wait=wait, as_json=as_json)

    finish(run_async(main()))


@session.command("send")
@db_option
@temporal_options(queue=False)
@click.argument("session_id", metavar="SESSION")
@click.argument("message")
@click.option("--wait", is_flag=True, help="wait until the turn settles")
@wait_timeout_option
@json_option()
def cmd_send(
    db: str | None,
    address: str | None,
    namespace: str | None,
    session_id: str,
    message: str,
    wait: bool,
    wait_timeout: float | None,
    as_json: bool,
) -> None:
    """Send a message (one new turn)."""
    from workers.client import connect

    s = settings(db=db, wait_timeout=wait_timeout)
    text = _message(message)

    async def main() -> int:
        client = await connect(address, namespace)
        accepted = await send_message(client, session_id, text, accept_timeout=s.wait_timeout)
        return await _after_send(client, s, session_id, accepted, wait=wait, as_json=as_json)

    finish(run_async(main()))


async def _after_send(
    client: Any, s: MakaSettings, session_id: str, accepted: Any, *, wait: bool, as_json: bool
) -> int:
    if not wait:
        if as_json:
            print_json(
                {
                    "ok": True,
                    "sessionId": session_id,
                    "turnId": accepted.turn_id,
                    "runId": accepted.run_id,
                    "invocationId": accepted.invocation_id,
                },
                indent=2,
            )
        else:
            click.echo(f"session {session_id}: turn {accepted.turn_id} accepted (run {accepted.run_id})")
        return 0
    status = await wait_settled(client, session_id, accepted.run_id, timeout=s.wait_timeout)
    view = _view(s.ledger, session_id, status, create=True)
    if as_json:
        print_json(view.to_json(), indent=2)
    else:
        _print_view(view)
    return 0 if view.state == "idle" else 1


def _view(db: Any, session_id: str, status: Any | None, *, create: bool) -> Any:
    from maka_core.runtime.session_view import session_view
    from workflows.contracts import workflow_id_for

    with open_ledger(db, create=create) as store:
        return session_view(
            store,
            session_id,
            workflow_id=workflow_id_for(session_id),
            state=status.state if status is not None else None,
            park_reason=status.park_reason if status is not None else None,
        )


def _print_view(view: Any) -> None:
    head = f"session {view.session_id}  state={view.state}" + (
        f"  park={view.park_reason}" if view.park_reason else ""
    )
    if not stdout_is_tty():  # a pipe or a log: one fact a line
        click.echo(head)
        for t in view.turns:
            click.echo(
                f"  turn {t.turn_id}  run {t.run_id}  {t.status}"
                + (f" ({t.park_reason})" if t.park_reason else "")
            )
        for o in view.operations:
            click.echo(f"  op {o.operation_id}  {o.tool_name:<10} {o.status:<26} {o.reason}")
        return
    from rich.table import Table

    out = console()
    out.print(head)
    turns = Table("turn", "run", "status", "park reason", title="turns", title_justify="left")
    for t in view.turns:
        turns.add_row(t.turn_id, t.run_id, t.status, t.park_reason or "")
    out.print(turns)
    if view.operations:
        ops = Table("operation", "tool", "status", "reason", title="tool calls", title_justify="left")
        for o in view.operations:
            ops.add_row(str(o.operation_id), o.tool_name, o.status, o.reason)
        out.print(ops)


@session.command("status")
@db_option
@temporal_options(queue=False)
@click.argument("session_id", metavar="SESSION")
@json_option()
def cmd_status(
    db: str | None, address: str | None, namespace: str | None, session_id: str, as_json: bool
) -> None:
    """State, turns and every tool call's facts."""
    from workers.client import connect

    s = settings(db=db)

    async def main() -> int:
        status = None
        try:
            client = await asyncio.wait_for(connect(address, namespace), 3)
            status = await asyncio.wait_for(query_status(client, session_id), 5)
        except Exception as exc:  # unreachable server or gone workflow: the ledger still answers
            print(
                f"maka: workflow not reachable ({type(exc).__name__}); state from the ledger", file=sys.stderr
            )
        try:
            view = _view(s.ledger, session_id, status, create=False)
        except MakaError as exc:
            if exc.code != "ledger_not_found" or status is None:
                raise
            view = _view("sqlite://", session_id, status, create=False)  # the workflow alone answers
        if status is None and view.event_count == 0 and not view.turns:
            raise MakaError("session_not_found", f"no session {session_id}", sessionId=session_id)
        if as_json:
            print_json(view.to_json(), indent=2)
        else:
            _print_view(view)
        return 0

    finish(run_async(main()))


@session.command("show")
@db_option
@click.argument("session_id", metavar="SESSION")
@json_option("the events as JSON lines")
def cmd_show(db: str | None, session_id: str, as_json: bool) -> None:
    """The transcript, from the ledger."""
    from maka_core.facts import codec
    from maka_core.runtime.session_view import transcript_lines

    with open_ledger(settings(db=db).ledger, create=False) as store:
        events = store.events(session_id=session_id)
    if not events:
        raise MakaError("session_not_found", f"no events for session {session_id}", sessionId=session_id)
    if as_json:
        for event in events:
            sys.stdout.write(codec.encode(event) + "\n")
    else:
        click.echo("\n".join(transcript_lines(events)))


COMMANDS = (cmd_worker, cmd_dev, cmd_demo, session)
