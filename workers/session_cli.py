"""``maka worker``, ``maka dev``, ``maka demo`` and ``maka session start|send|status|show``.

Every command honours ``MAKA_HOME`` (ledger, dev-server database, logs), the standard Temporal client
settings (``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, envconfig profiles; ``--address`` and
``--namespace`` override them), one default task queue (``MAKA_TASK_QUEUE`` or ``maka``) and ``--db``.
``--json`` output is for scripts; progress goes to stderr. Exit codes: 0 settled idle, 1 the turn
parked or failed, 2 refused input (an unknown session, a message the session refused).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from maka_core import paths
from maka_core.errors import MakaError


def _common(p: argparse.ArgumentParser, *, queue: bool = True) -> None:
    p.add_argument(
        "--db",
        default=None,
        help="ledger: a SQLite file or a SQLAlchemy URL such as postgresql+psycopg://... "
        "(default: $MAKA_HOME/ledger.sqlite)",
    )
    p.add_argument("--address", default=None, help="Temporal frontend host:port (default: TEMPORAL_ADDRESS)")
    p.add_argument("--namespace", default=None, help="Temporal namespace (default: TEMPORAL_NAMESPACE)")
    if queue:
        p.add_argument("--task-queue", default=None, help="task queue (default: MAKA_TASK_QUEUE or 'maka')")


def register(subparsers: Any) -> None:
    """Add the worker, dev, demo and session commands to the ``maka`` parser."""
    p = subparsers.add_parser("worker", help="run a worker: startup repair, then poll")
    _common(p)
    p.add_argument(
        "--tool-heartbeat-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="tool activities' heartbeat timeout (env MAKA_TOOL_HEARTBEAT_TIMEOUT; default 20)",
    )
    p.add_argument("--no-repair", action="store_true", help="skip startup repair (tests only)")
    p.add_argument("--json", action="store_true", help="lifecycle events as JSON lines on stderr")
    p.set_defaults(func=cmd_worker)

    p = subparsers.add_parser("dev", help="run the embedded Temporal dev server (+ a worker)")
    _common(p)
    p.add_argument("--port", type=int, default=7233, help="frontend gRPC port (default 7233)")
    p.add_argument("--ui-port", type=int, default=None, help="Web UI port (default: port + 1000)")
    p.add_argument("--no-worker", action="store_true", help="bring up the server alone")
    p.add_argument("--tool-heartbeat-timeout", type=float, default=None, metavar="SECONDS")
    p.add_argument("--json", action="store_true", help="server and worker lifecycle events as JSON lines")
    p.set_defaults(func=cmd_dev)

    p = subparsers.add_parser("demo", help="run a scripted session on a sample workspace")
    _common(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_demo)

    session = subparsers.add_parser("session", help="start, message and inspect sessions")
    ssub = session.add_subparsers(dest="session_command", required=True, metavar="COMMAND")

    p = ssub.add_parser("start", help="start a session and send its first message")
    _common(p)
    p.add_argument("--workspace", required=True, type=Path)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--script", type=Path, help="scripted provider: a JSON script file")
    src.add_argument("--model", help="OpenAI-compatible model name (OPENAI_BASE_URL, OPENAI_API_KEY)")
    p.add_argument("--session-id", default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--continue-as-new-after",
        type=int,
        default=None,
        metavar="TURNS",
        help="continue-as-new after this many turns (default: when Temporal suggests)",
    )
    p.add_argument("--model-step-mode", choices=("local", "activity"), default="local")
    p.add_argument("--wait", action="store_true", help="wait until the turn settles")
    p.add_argument("--json", action="store_true")
    p.add_argument("message")
    p.set_defaults(func=cmd_start)

    p = ssub.add_parser("send", help="send a message (one new turn)")
    _common(p, queue=False)
    p.add_argument("session")
    p.add_argument("message")
    p.add_argument("--wait", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_send)

    p = ssub.add_parser("status", help="state, turns and every tool call's facts")
    _common(p, queue=False)
    p.add_argument("session")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = ssub.add_parser("show", help="the transcript, from the ledger")
    _common(p, queue=False)
    p.add_argument("session")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_show)


# --- helpers ---------------------------------------------------------------------------------


def _db(args: argparse.Namespace) -> Any:
    if args.db and "://" in args.db:
        return args.db  # a database URL (e.g. a shared Postgres ledger)
    db = Path(args.db) if args.db else paths.default_ledger_path()
    db.parent.mkdir(parents=True, exist_ok=True)
    return db


def _queue(args: argparse.Namespace) -> str:
    return getattr(args, "task_queue", None) or paths.default_task_queue()


def _emit_line(obj: dict[str, Any]) -> None:
    """One compact JSON object on one line (lifecycle events of long-running commands)."""
    print(json.dumps(obj), flush=True)


def _emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False))


def _fail(code: str, message: str, as_json: bool, exit_code: int = 2, **detail: Any) -> int:
    if as_json:
        _emit({"ok": False, "code": code, "message": message, **detail})
    else:
        print(f"maka: {code}: {message}", file=sys.stderr)
    return exit_code


def _run(main: Any, as_json: bool = False) -> int:
    """Run a command's coroutine, then leave the process without interpreter finalization.

    The Temporal core runs Rust threads that may still call back into Python for a moment after the
    event loop closes; finalizing the interpreter under them can crash the process (SIGSEGV/SIGABRT)
    after a correct run. Output is flushed and every store is closed before this point.
    """
    try:
        code = int(asyncio.run(main) or 0)
    except MakaError as exc:  # a refusal with a stable code, never a traceback
        code = _fail(exc.code, exc.message, as_json, **exc.detail)
    sys.stdout.flush()
    sys.stderr.flush()
    if os.environ.get("MAKA_NO_HARD_EXIT"):
        return code
    os._exit(code)


def _settled_exit(state: str) -> int:
    return 0 if state == "idle" else 1


# --- worker / dev ----------------------------------------------------------------------------


def _settings(args: argparse.Namespace) -> Any:
    from maka_core.runtime.runtime import RuntimeSettings

    return RuntimeSettings.from_env(getattr(args, "tool_heartbeat_timeout", None))


def cmd_worker(args: argparse.Namespace) -> int:
    from workers.client import connect
    from workers.worker import serve

    async def main() -> int:
        client = await connect(args.address, args.namespace)
        await serve(
            client,
            _db(args),
            _queue(args),
            settings=_settings(args),
            repair=not args.no_repair,
            json_events=args.json,
        )
        return 0

    return _run(main(), getattr(args, "json", False))


def cmd_dev(args: argparse.Namespace) -> int:
    from workers import devserver
    from workers.client import connect
    from workers.worker import serve

    home = paths.maka_home()
    server = devserver.start(
        port=args.port,
        ui=True,
        ui_port=args.ui_port,
        db_file=home / "temporal.db",
        log_path=home / "logs" / "temporal.log",
    )
    if args.json:
        _emit_line(
            {
                "event": "server",
                "address": server.address,
                "ui": server.ui_address,
                "database": str(server.db_file),
            }
        )
    else:
        print(f"Temporal dev server: {server.address}  (database {server.db_file})", flush=True)
        print(f"Temporal UI:         {server.ui_address}", flush=True)

    async def main() -> int:
        if args.no_worker:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            import signal

            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            if not args.json:
                print("maka dev: server only (--no-worker); Ctrl-C to stop", flush=True)
            await stop.wait()
            return 0
        client = await connect(server.address, args.namespace)
        await serve(
            client, _db(args), _queue(args), settings=_settings(args), out=sys.stdout, json_events=args.json
        )
        return 0

    async def main_then_stop() -> int:
        try:
            return await main()
        finally:
            server.stop()  # before _run leaves the process: never orphan the server

    return _run(main_then_stop(), getattr(args, "json", False))


# --- sessions --------------------------------------------------------------------------------


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
) -> tuple[str, Any]:
    """Start a session workflow and send its first message; returns (session id, TurnAccepted)."""
    from maka_core.workspace import Workspace
    from workflows.contracts import SEND_MESSAGE, SendMessage, SessionInput, TurnAccepted, workflow_id_for
    from workflows.session import SessionWorkflow, initial_search_attributes

    ws = Workspace.open(workspace, create=True)
    if task_timeout is None and os.environ.get("MAKA_WORKFLOW_TASK_TIMEOUT"):
        # Drills: a killed worker's in-flight workflow task (a local model step) is retried after this.
        task_timeout = timedelta(seconds=float(os.environ["MAKA_WORKFLOW_TASK_TIMEOUT"]))
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
    handle = await client.start_workflow(
        SessionWorkflow.run,
        inp,
        id=workflow_id_for(session_id),
        task_queue=task_queue,
        search_attributes=initial_search_attributes(session_id),
        task_timeout=task_timeout,
    )
    accepted = await handle.execute_update(SEND_MESSAGE, SendMessage(text=message), result_type=TurnAccepted)
    return session_id, accepted


async def send_message(client: Any, session_id: str, message: str) -> Any:
    from workflows.contracts import SEND_MESSAGE, SendMessage, TurnAccepted, workflow_id_for

    handle = client.get_workflow_handle(workflow_id_for(session_id))
    return await handle.execute_update(SEND_MESSAGE, SendMessage(text=message), result_type=TurnAccepted)


async def query_status(client: Any, session_id: str) -> Any:
    from workflows.contracts import STATUS_QUERY, SessionStatus, workflow_id_for

    handle = client.get_workflow_handle(workflow_id_for(session_id))
    return await handle.query(STATUS_QUERY, result_type=SessionStatus)


async def wait_settled(
    client: Any, session_id: str, run_id: str, *, timeout: float = 600.0, progress: bool = True
) -> Any:
    """Poll the status query until the turn ``run_id`` has settled (idle, parked or failed).

    Progress goes to stderr: a self-updating line on a terminal; in a log, one line when the state
    changes and otherwise every 10 s, so a long wait is visible without flooding the log.
    """
    start = time.monotonic()
    live = progress and sys.stderr.isatty()
    last_state, last_line_at = "", 0.0
    while True:
        status = await query_status(client, session_id)
        elapsed = time.monotonic() - start
        done = status.current_turn is None or status.current_turn.run_id != run_id
        if done and status.state != "running":
            if progress:
                prefix = "\r" if live else ""
                print(f"{prefix}[{elapsed:5.1f}s] {status.state}" + " " * 20, file=sys.stderr, flush=True)
            return status
        if live:
            print(f"\r[{elapsed:5.1f}s] {status.state}…", end="", file=sys.stderr, flush=True)
        elif progress and (status.state != last_state or elapsed - last_line_at >= 10):
            print(f"[{elapsed:5.1f}s] {status.state}", file=sys.stderr, flush=True)
            last_state, last_line_at = status.state, elapsed
        if elapsed > timeout:
            raise TimeoutError(f"turn {run_id} did not settle in {timeout:.0f}s")
        await asyncio.sleep(0.05)


def _view(db: Any, session_id: str, status: Any | None) -> Any:
    from maka_core.runtime.session_view import session_view
    from maka_core.store.writer import LedgerStore
    from workflows.contracts import workflow_id_for

    with LedgerStore.open(db) as store:
        return session_view(
            store,
            session_id,
            workflow_id=workflow_id_for(session_id),
            state=status.state if status is not None else None,
            park_reason=status.park_reason if status is not None else None,
        )


def _print_view(view: Any) -> None:
    print(
        f"session {view.session_id}  state={view.state}"
        + (f"  park={view.park_reason}" if view.park_reason else "")
    )
    for t in view.turns:
        print(
            f"  turn {t.turn_id}  run {t.run_id}  {t.status}"
            + (f" ({t.park_reason})" if t.park_reason else "")
        )
    for o in view.operations:
        print(f"  op {o.operation_id}  {o.tool_name:<10} {o.status:<26} {o.reason}")


def _update_error(exc: BaseException) -> tuple[str, str]:
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.exceptions import ApplicationError
    from temporalio.service import RPCError, RPCStatusCode

    # Stable snake_case codes for scripts: the validator's refusal types (SessionParked ->
    # session_parked, TurnInFlight -> turn_in_flight, ...) and the server's answers.
    if isinstance(exc, WorkflowUpdateFailedError) and isinstance(exc.cause, ApplicationError):
        return _snake(exc.cause.type or "update_rejected"), exc.cause.message
    if isinstance(exc, RPCError) and exc.status == RPCStatusCode.NOT_FOUND:
        return "session_not_found", str(exc)
    if isinstance(exc, RPCError):
        return "temporal_unavailable", str(exc)
    return _snake(type(exc).__name__), str(exc)


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(name))


def _provider_spec(args: argparse.Namespace) -> dict[str, Any]:
    if args.script is not None:
        return {"kind": "script", "path": str(args.script.resolve())}
    return {"kind": "openai", "model": args.model}


def cmd_start(args: argparse.Namespace) -> int:
    from workers.client import connect

    async def main() -> int:
        client = await connect(args.address, args.namespace)
        try:
            session_id, accepted = await start_session(
                client,
                workspace=args.workspace,
                provider=_provider_spec(args),
                task_queue=_queue(args),
                message=args.message,
                session_id=args.session_id,
                continue_as_new_after=args.continue_as_new_after,
                model_step_mode=args.model_step_mode,
            )
        except MakaError as exc:
            return _fail(exc.code, exc.message, args.json)
        return await _after_send(client, args, session_id, accepted)

    return _run(main(), getattr(args, "json", False))


async def _after_send(client: Any, args: argparse.Namespace, session_id: str, accepted: Any) -> int:
    if not args.wait:
        out = {
            "ok": True,
            "sessionId": session_id,
            "turnId": accepted.turn_id,
            "runId": accepted.run_id,
            "invocationId": accepted.invocation_id,
        }
        if args.json:
            _emit(out)
        else:
            print(f"session {session_id}: turn {accepted.turn_id} accepted (run {accepted.run_id})")
        return 0
    status = await wait_settled(client, session_id, accepted.run_id)
    view = _view(_db(args), session_id, status)
    if args.json:
        _emit(view.to_json())
    else:
        _print_view(view)
    return _settled_exit(view.state)


def cmd_send(args: argparse.Namespace) -> int:
    from workers.client import connect

    async def main() -> int:
        client = await connect(args.address, args.namespace)
        try:
            accepted = await send_message(client, args.session, args.message)
        except Exception as exc:
            code, message = _update_error(exc)
            # A failed update leaves a core RPC callback in flight for a moment; exiting the
            # interpreter under it can crash the process at finalization (seen as SIGSEGV/SIGABRT).
            await asyncio.sleep(0.2)
            return _fail(code, message, args.json, sessionId=args.session)
        return await _after_send(client, args, args.session, accepted)

    return _run(main(), getattr(args, "json", False))


def cmd_status(args: argparse.Namespace) -> int:
    from workers.client import connect

    async def main() -> int:
        status = None
        try:
            client = await asyncio.wait_for(connect(args.address, args.namespace), 3)
            status = await asyncio.wait_for(query_status(client, args.session), 5)
        except Exception as exc:  # unreachable server or gone workflow: the ledger still answers
            print(
                f"maka: workflow not reachable ({type(exc).__name__}); state from the ledger", file=sys.stderr
            )
        view = _view(_db(args), args.session, status)
        if status is None and view.event_count == 0 and not view.turns:
            return _fail("session_not_found", f"no session {args.session}", args.json)
        if args.json:
            _emit(view.to_json())
        else:
            _print_view(view)
        return 0

    return _run(main(), getattr(args, "json", False))


def cmd_show(args: argparse.Namespace) -> int:
    from maka_core.facts import codec
    from maka_core.runtime.session_view import transcript_lines
    from maka_core.store.writer import LedgerStore

    with LedgerStore.open(_db(args)) as store:
        events = store.events(session_id=args.session)
    if not events:
        return _fail("session_not_found", f"no events for session {args.session}", args.json)
    if args.json:
        for event in events:
            print(codec.encode(event))
    else:
        print("\n".join(transcript_lines(events)))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from workers import demo  # imported late: the demo module builds on this one

    return demo.cmd_demo(args)
