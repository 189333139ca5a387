"""``maka session start|send|status|show`` (the Temporal side is ``workers.session_client``).

Every command reads ``maka_core.settings`` (``MAKA_HOME``, ``MAKA_DB``, ``MAKA_TASK_QUEUE``...; flags
win), the standard Temporal client settings (``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, envconfig
profiles; ``--address`` and ``--namespace`` override them) and ``--db``. Input is validated before
anything is started or written. ``--json`` output is for scripts; progress goes to stderr. Exit
codes: 0 settled idle, 1 the turn parked or failed, 2 refused (an unknown session, a bad message or
script, no server, a wait that timed out).
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from maka_core.errors import ConfigError, MakaError
from maka_core.facts.session_id import check_session_id
from maka_core.runtime.contracts import DEFAULT_MAX_STEPS_PER_TURN, DEFAULT_STEP_TIMEOUT_S
from maka_core.settings import MakaSettings
from maka_core.store.engine import sqlite_file
from maka_core.workspace import check_workspace_location
from maka_temporal.workers.cancel_cli import cmd_cancel
from maka_temporal.workers.cli_base import (
    console,
    db_option,
    ensure_utf8,
    finish,
    json_option,
    open_ledger,
    print_json,
    run_async,
    session_events,
    settings,
    stdout_is_tty,
    temporal_options,
)
from maka_temporal.workers.governance_cli import (
    cmd_approve,
    cmd_deny,
    cmd_session_receipts,
    governance_status,
    policy_options,
    session_policy,
)
from maka_temporal.workers.session_client import (
    START_NEVER_HAPPENED,
    check_step_timeout,
    describe_execution,
    new_session_config,
    query_status,
    send_message,
    start_execution,
    start_session,
    update_error,
    wait_settled,
)

if TYPE_CHECKING:
    from maka_core.providers.spec import AnthropicSpec, OpenAISpec, ScriptSpec
    from maka_core.runtime.contracts import SessionConfig

__all__ = ["query_status", "send_message", "start_session", "update_error", "wait_settled"]


wait_timeout_option = click.option(
    "--wait-timeout",
    type=float,
    default=None,
    metavar="SECONDS",
    help="give up waiting after this long, keeping the session (MAKA_WAIT_TIMEOUT; default 600)",
)


# --- session commands --------------------------------------------------------------------------


@click.group("session")
def session() -> None:
    """Start, message and inspect sessions."""


def _message(text: str) -> str:
    ensure_utf8(text, "message")
    if not text.strip():
        raise MakaError("empty_message", "the message is empty")
    return text


#: The longest system prompt a session takes: the prompt rides in the provider spec, which every
#: model-step and tool activity input carries into the workflow's history.
MAX_SYSTEM_BYTES = 16 * 1024


def _system_prompt(value: str | None) -> str | None:
    """``--system TEXT`` or ``--system @FILE`` (the file's UTF-8 text).

    Raises:
        ConfigError: ``system_file_unreadable`` (missing, unreadable or not UTF-8);
            ``config_invalid`` (empty, or longer than ``MAX_SYSTEM_BYTES``).
    """
    if value is None:
        return None
    text = ensure_utf8(value, "system_prompt")
    if value.startswith("@"):
        path = Path(value[1:]).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise ConfigError(
                "system_file_unreadable", f"cannot read the system prompt {path}: {why}", path=str(path)
            ) from None
    if not text.strip():
        raise ConfigError("config_invalid", "the system prompt is empty", setting="system")
    if len(text.encode("utf-8")) > MAX_SYSTEM_BYTES:
        raise ConfigError(
            "config_invalid", f"the system prompt is over {MAX_SYSTEM_BYTES} bytes", setting="system"
        )
    return text


def _provider_spec(
    script: Path | None,
    model: str | None,
    *,
    system: str | None = None,
    temperature: float | None = None,
    max_tokens: int | None = None,
    step_timeout: float | None = None,
) -> ScriptSpec | OpenAISpec | AnthropicSpec:
    from maka_core.providers.scripted import ScriptedProvider
    from maka_core.providers.spec import ScriptSpec, model_spec

    if script is not None and model is not None:
        raise ConfigError("config_invalid", "give either --script or --model")
    if script is not None:
        given = [
            f
            for f, v in (("--system", system), ("--temperature", temperature), ("--max-tokens", max_tokens))
            if v is not None
        ]
        if given:
            # A script answers for the model: it has no prompt or sampling to set, and a setting
            # accepted and then dropped would be input lost.
            raise ConfigError(
                "config_invalid", f"{', '.join(given)} set a model (--model), not a script", setting=given[0]
            )
        try:
            ScriptedProvider.from_file(script)  # the whole script, before anything starts
        except RecursionError:
            raise ConfigError("script_invalid", f"{script} is nested too deeply", path=str(script)) from None
        return ScriptSpec(path=str(script.resolve()))
    if not model or not model.strip():
        raise ConfigError("config_invalid", "give --script FILE or --model PROVIDER:NAME")
    # The provider's HTTP timeout follows the step's own, so a long call is not cut short below it.
    return model_spec(
        model, system=system, temperature=temperature, max_tokens=max_tokens, timeout_seconds=step_timeout
    )


def _workspace(path: Path, s: MakaSettings) -> Path:
    # The same codes Workspace.open uses, checked before the marker file is written: a workspace is
    # a project folder, never /, a home or system folder, nor one holding MAKA_HOME or the ledger.
    if not path.exists():
        raise ConfigError("workspace_not_found", f"no workspace at {path}", path=str(path))
    if not path.is_dir():
        raise ConfigError("invalid_workspace", f"{path} is not a directory", path=str(path))
    ledger = s.ledger
    check_workspace_location(
        path, maka_home=s.home, ledger_path=ledger if isinstance(ledger, Path) else sqlite_file(ledger)
    )
    return path


@session.command("start")
@db_option
@temporal_options()
@click.option("--workspace", required=True, type=click.Path(path_type=Path))
@click.option(
    "--script", type=click.Path(path_type=Path), default=None, help="scripted provider: a JSON script file"
)
@click.option(
    "--model",
    default=None,
    metavar="PROVIDER:NAME",
    help="openai:NAME (OPENAI_API_KEY, OPENAI_BASE_URL) or anthropic:NAME (ANTHROPIC_API_KEY, "
    "ANTHROPIC_BASE_URL), read by the worker; a bare NAME is openai",
)
@click.option(
    "--session-id",
    default=None,
    help="use this id instead of a new one (letters, digits, . _ : @ -); "
    "a taken id is refused (session_exists)",
)
@click.option(
    "--continue-as-new-after",
    type=click.IntRange(min=1),
    default=None,
    metavar="TURNS",
    help="continue-as-new after this many turns (default: when Temporal suggests)",
)
@click.option(
    "--continue-as-new-after-steps",
    type=click.IntRange(min=1),
    default=None,
    metavar="STEPS",
    help="within a long turn, continue-as-new after this many model steps (default: when Temporal suggests)",
)
@click.option("--model-step-mode", type=click.Choice(["with_tool", "local", "activity"]), default="with_tool")
@click.option(
    "--max-steps",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_STEPS_PER_TURN,
    show_default=True,
    metavar="STEPS",
    help="model steps a turn may take before it parks (max_steps_exceeded)",
)
@click.option(
    "--system",
    default=None,
    metavar="TEXT|@FILE",
    help="the system prompt (or @FILE: the file's UTF-8 text), sent as the model's system message",
)
@click.option(
    "--temperature",
    type=float,
    default=None,
    help="sampling temperature (openai 0..2; anthropic models take none)",
)
@click.option(
    "--max-tokens", type=int, default=None, metavar="N", help="bound on each model step's output tokens"
)
@click.option(
    "--step-timeout",
    type=float,
    default=DEFAULT_STEP_TIMEOUT_S,
    show_default=True,
    metavar="SECONDS",
    help="the model step's start-to-close (1..3600), also the provider's HTTP timeout",
)
@click.option(
    "--host",
    default=None,
    metavar="NAME",
    help="the workspace's host: tools run only on its workers (MAKA_HOST; default the machine's name; "
    "MAKA_HOST_WAIT bounds how long it may take to start one)",
)
@click.option("--wait", is_flag=True, help="wait until the turn settles")
@wait_timeout_option
@json_option()
@policy_options
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
    continue_as_new_after_steps: int | None,
    model_step_mode: str,
    max_steps: int,
    system: str | None,
    temperature: float | None,
    max_tokens: int | None,
    step_timeout: float,
    host: str | None,
    wait: bool,
    wait_timeout: float | None,
    as_json: bool,
    message: str,
    policy_file: Path | None = None,
    principal: str | None = None,
    on_behalf_of: tuple[str, ...] = (),
    unhinged: bool = False,
) -> None:
    """Start a session and send its first message."""
    from maka_temporal.workers.client import connect

    s = settings(db=db, task_queue=task_queue, wait_timeout=wait_timeout, host=host)
    text = _message(message)
    if session_id is not None:
        check_session_id(session_id)
    check_step_timeout(step_timeout)  # before it becomes the provider's HTTP timeout too
    provider = _provider_spec(
        script,
        model,
        system=_system_prompt(system),
        temperature=temperature,
        max_tokens=max_tokens,
        step_timeout=step_timeout if step_timeout != DEFAULT_STEP_TIMEOUT_S else None,
    )
    new_session_config(  # every setting checked before anything is written
        provider,
        model_step_mode=model_step_mode,
        step_timeout_s=step_timeout,
        max_steps_per_turn=max_steps,
        continue_as_new_after_turns=continue_as_new_after,
        continue_as_new_after_steps=continue_as_new_after_steps,
    )
    _workspace(workspace, s)
    governed = session_policy(s, session_id, policy_file, principal, on_behalf_of, unhinged)

    async def main() -> int:
        client = await connect(address, namespace)
        recorded = governed.record_in(s)
        try:
            sid, accepted = await start_session(
                client,
                workspace=workspace,
                provider=provider,
                task_queue=s.task_queue,
                message=text,
                session_id=governed.session_id,
                continue_as_new_after=continue_as_new_after,
                continue_as_new_after_steps=continue_as_new_after_steps,
                model_step_mode=model_step_mode,
                max_steps_per_turn=max_steps,
                step_timeout_s=step_timeout,
                accept_timeout=s.wait_timeout,
                refusals=True,
                host=s.host,
                host_wait_s=s.host_wait,
            )
        except MakaError as exc:
            # The server refused the start outright (no workflow exists, nothing read the policy):
            # leave no policy behind, so a corrected start may choose another. Any other failure
            # (``temporal_unavailable`` may hide a start that happened) keeps it.
            if recorded and exc.code in START_NEVER_HAPPENED:
                governed.forget_in(s)
            raise
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
    from maka_temporal.workers.client import connect

    s = settings(db=db, wait_timeout=wait_timeout)
    text = _message(message)

    async def main() -> int:
        client = await connect(address, namespace)
        if not (await describe_execution(client, session_id)).open:
            await _reopen(client, s, session_id)
        accepted = await send_message(client, session_id, text, accept_timeout=s.wait_timeout, refusals=True)
        return await _after_send(client, s, session_id, accepted, wait=wait, as_json=as_json)

    finish(run_async(main()))


async def _reopen(client: Any, s: MakaSettings, session_id: str) -> None:
    """A new execution for a session whose execution is gone, only when its last run ended cleanly.

    A run that a repair closed (its execution was lost mid-turn), a parked run, an unresolved
    operation or a claimed continuation that never ran all need ``maka resume`` (the planner).

    Raises:
        MakaError: ``session_not_found``, ``resume_required``, ``session_busy``.
    """
    from maka_core.runtime.continuation import read_session
    from maka_core.runtime.session_view import session_view
    from maka_temporal.workflows.contracts import workflow_id_for

    try:
        store = open_ledger(s.ledger, create=False)
    except MakaError as exc:
        if exc.code != "ledger_not_found":
            raise
        raise MakaError("session_not_found", f"no session {session_id}", sessionId=session_id) from None
    with store:
        session = read_session(store, session_id)
        view = session_view(store, session_id, workflow_id=workflow_id_for(session_id))
    latest = session.latest
    if latest is None:
        raise MakaError("session_not_found", f"no session {session_id}", sessionId=session_id)
    events = session.events.get(latest.run_id, [])
    terminal = next((e for e in reversed(events) if e.is_terminal), None)
    delta = terminal.actions.state_delta if terminal is not None and terminal.actions is not None else None
    recovered = isinstance(delta, dict) and bool(delta.get("recovered"))
    pending_claim = any(
        not any(e.is_terminal for e in session.events.get(c.target_run_id, [])) for c in session.claims
    )
    if view.state not in ("idle", "failed") or terminal is None or recovered or pending_claim:
        raise MakaError(
            "resume_required",
            f"session {session_id} lost its execution before its last run settled; "
            f"run `maka resume {session_id}`",
            sessionId=session_id,
            state=view.state,
        )
    record = session.record
    if record is None:
        raise MakaError(
            "resume_required", "the ledger holds no session record to restart from", sessionId=session_id
        )
    await start_execution(
        client,
        session_id,
        workspace=record.workspace,
        workspace_identity=record.workspace_identity,
        config=record.config,  # the session's settings, as recorded at its start
        task_queue=record.task_queue or s.task_queue,
    )


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
    from maka_temporal.workflows.contracts import workflow_id_for

    with open_ledger(db, create=create) as store:
        return session_view(
            store,
            session_id,
            workflow_id=workflow_id_for(session_id),
            state=status.state if status is not None else None,
            park_reason=status.park_reason if status is not None else None,
        )


def _print_view(view: Any, *, state: str | None = None) -> None:
    """``state``: what the status knows beyond the view (``awaiting_approval``), as ``--json`` says."""
    head = f"session {view.session_id}  state={state or view.state}" + (
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
    from maka_temporal.workers.client import connect

    s = settings(db=db)

    async def main() -> int:
        status = None
        execution = None
        # Notes wait until the session is known to exist: an unknown session or a missing ledger is
        # one refusal, not a note about state "from the ledger" followed by it.
        notes: list[str] = []
        try:
            client = await asyncio.wait_for(connect(address, namespace), 3)
            execution = await asyncio.wait_for(describe_execution(client, session_id), 5)
            if execution.open:
                status = await asyncio.wait_for(query_status(client, session_id), 5)
            else:
                # A closed execution's Query replays its last in-memory state ("running" for one
                # terminated mid-turn): only the ledger knows what became of it.
                notes.append(f"maka: execution {execution.status or 'not found'}; state from the ledger")
        except Exception as exc:  # unreachable server or gone workflow: the ledger still answers
            why = exc.code if isinstance(exc, MakaError) else type(exc).__name__
            notes.append(f"maka: workflow not reachable ({why}); state from the ledger")
        if execution is not None and execution.task_failing:
            notes.append(
                f"maka: the workflow task of session {session_id} keeps failing "
                f"(attempt {execution.task_attempt}; an incompatible deploy?): terminate the execution, "
                f"then `maka resume {session_id}`"
            )
        try:
            view = _view(s.ledger, session_id, status, create=False)
        except MakaError as exc:
            if exc.code != "ledger_not_found" or status is None:
                raise
            view = _view("sqlite://", session_id, status, create=False)  # the workflow alone answers
        if status is None and view.event_count == 0 and not view.turns:
            raise MakaError("session_not_found", f"no session {session_id}", sessionId=session_id)
        resume_refusal = None
        if status is None and not view.turns:
            # Events without run headers (an imported ledger): resume refuses, and says so here too.
            from maka_temporal.workers.resume_cli import runs_missing

            refusal = runs_missing(session_id, view.event_count)
            resume_refusal = refusal.to_json()
            notes.append(f"maka: {refusal.code}: {refusal.message}")
        for note in notes:
            print(note, file=sys.stderr)
        health = _ledger_health(s.ledger)
        governed = _governance_status(s.ledger, session_id, view.state)
        config = _session_config(s.ledger, session_id)
        host_wait = config.host_wait_s if config is not None else None
        host = (config.host if config is not None else None) or (status.host if status is not None else None)
        if execution is not None and not execution.open and view.state == "running":
            print(
                f"maka: session {session_id} lost its execution before its run settled; a worker's "
                f"startup repair or `maka resume {session_id}` settles it from the ledger",
                file=sys.stderr,
            )
        if as_json:
            print_json(
                {
                    **view.to_json(),
                    **(execution.to_json() if execution else {}),
                    "host": host,
                    "hostWait": host_wait,
                    "config": config.to_json() if config is not None else None,
                    "ledger": health,
                    **governed,
                    **({"resume": resume_refusal} if resume_refusal else {}),
                },
                indent=2,
            )
        else:
            _print_view(view, state=governed.get("state"))
            if host is not None:
                click.echo(f"host {host}" + (f"  (host wait {host_wait:g}s)" if host_wait else ""))
            for p in governed["pendingApprovals"]:
                click.echo(f"awaiting approval {p['approvalId']}  {p['toolName']}  phrase: {p['phrase']}")
            if not health["ok"]:
                click.echo(f"ledger unusable ({health['code']}): {health['message']}")
        return 0

    finish(run_async(main()))


def _session_config(db: Any, session_id: str) -> SessionConfig | None:
    """The settings the session recorded at start (from the ledger)."""
    from maka_core.runtime.lost_run import session_record

    try:
        with open_ledger(db, create=False) as store:
            record = session_record(store.events(session_id=session_id))
    except MakaError:
        return None
    return record.config if record is not None else None


def _governance_status(db: Any, session_id: str, state: str) -> dict[str, Any]:
    try:
        with open_ledger(db, create=False) as store:
            return governance_status(store, session_id, state)
    except MakaError:
        return {"pendingApprovals": []}


def _ledger_health(db: Any) -> dict[str, Any]:
    """Whether the ledger can take the next write (read-only, full), without writing to it."""
    from maka_core.store.engine import database_url, sqlite_file
    from maka_core.store.health import probe_path, probe_url

    url = database_url(db)
    file = sqlite_file(url)
    if file is not None:
        return probe_path(file)
    return probe_url(url) if url.startswith("postgresql") else {"ok": True}


#: C0/C1 controls (but newline and tab), DEL, and the bidi overrides/isolates that reorder text.
_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _printable(text: str) -> str:
    """A transcript line safe for a terminal: escape sequences and controls shown, not obeyed."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


@session.command("show")
@db_option
@click.argument("session_id", metavar="SESSION")
@json_option("the events as JSON lines")
def cmd_show(db: str | None, session_id: str, as_json: bool) -> None:
    """The transcript, from the ledger."""
    from maka_core.facts import codec
    from maka_core.runtime.session_view import transcript_lines

    events = session_events(settings(db=db).ledger, session_id)
    if as_json:
        for event in events:
            sys.stdout.write(codec.encode(event) + "\n")
    else:
        click.echo("\n".join(_printable(line) for line in transcript_lines(events)))


@session.command("resolve")
@db_option
@click.argument("session_id", metavar="SESSION")
@click.option("--operation", "operation_id", required=True, metavar="OP", help="the parked operation id")
@click.option(
    "--decision",
    required=True,
    type=click.Choice(["applied", "not_applied", "abandon"]),
    help="applied: it took effect (counts as done); not_applied: it did not (the model may ask again); "
    "abandon: leave it",
)
@click.option("--by", "resolved_by", required=True, metavar="NAME", help="who decides (recorded)")
@click.option("--reason", required=True, metavar="TEXT", help="why (recorded)")
@json_option()
def cmd_resolve(
    db: str | None,
    session_id: str,
    operation_id: str,
    decision: str,
    resolved_by: str,
    reason: str,
    as_json: bool,
) -> None:
    """Record an operator's resolution of a parked operation (append-only), then `maka resume`."""
    from maka_core.runtime.resolution import resolve_operation

    with open_ledger(settings(db=db).ledger, create=False) as store:
        recorded = resolve_operation(store, session_id, operation_id, decision, resolved_by, reason)
    if as_json:
        print_json({"ok": True, **recorded}, indent=2)
    else:
        click.echo(
            f"session {session_id}: operation {operation_id} resolved {decision} by {resolved_by} "
            f"(answers {recorded['parkedEventId']}); now `maka resume {session_id}`"
        )


for _command in (cmd_approve, cmd_deny, cmd_session_receipts, cmd_cancel):
    session.add_command(_command)
