"""``maka session start|send|status|list|resolve|approve|deny`` answer through ``SessionClient``
(``workers.client.session_api``), the library's own client; ``show`` reads the ledger's events as they are.

Every command reads ``maka_core.settings`` (``MAKA_HOME``, ``MAKA_DB``, ``MAKA_TASK_QUEUE``...; flags
win), the standard Temporal client settings (``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, envconfig
profiles; ``--address`` and ``--namespace`` override them) and ``--db``. Input is validated before
anything is started or written. ``--json`` output is for scripts; progress goes to stderr. Exit
codes: 0 settled idle, 1 the turn parked or failed, 2 refused (an unknown session, a bad message or
script, no server, a wait that timed out).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from maka_core.errors import ConfigError
from maka_core.facts import canonical_json
from maka_core.facts.printable import printable
from maka_core.runtime.contracts import (
    DEFAULT_MAX_PARALLEL_TOOLS,
    DEFAULT_MAX_STEPS_PER_TURN,
    DEFAULT_STEP_TIMEOUT_S,
    MAX_PARALLEL_TOOLS_BOUNDS,
    NEW_SESSION_TOOL_MODE,
)
from maka_temporal.workers.cli.base import (
    LEDGER_FALLBACK_S,
    WaitLine,
    add_commands,
    cell,
    console,
    db_option,
    finish,
    json_option,
    print_json,
    run_async,
    say,
    say_text,
    settings,
    stdout_is_tty,
    temporal_options,
    wait_timeout_option,
)
from maka_temporal.workers.cli.cancel import cmd_cancel
from maka_temporal.workers.cli.governance import cmd_approve, cmd_deny, cmd_session_receipts, policy_options
from maka_temporal.workers.cli.session_list import cmd_list
from maka_temporal.workers.client.answers import Status, TurnStarted
from maka_temporal.workers.client.pollers import warn_while_unpolled
from maka_temporal.workers.client.session_api import SessionClient
from maka_temporal.workers.client.session_start import SessionStart

__all__ = ["session"]


# --- session commands --------------------------------------------------------------------------


@click.group("session")
def session() -> None:
    """Start, message and inspect sessions."""


# The checks of a new session live in ``workers.client.session_start``: the CLI, ``SessionClient`` and a
# child session refuse the same inputs.


@click.command("start")
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
    "--tool-mode",
    type=click.Choice(["activity", "hybrid"]),
    default=NEW_SESSION_TOOL_MODE,
    show_default=True,
    help="hybrid: a bounded tool call's first dispatch runs as a local activity (no server round trip)",
)
@click.option(
    "--max-parallel-tools",
    type=click.IntRange(*MAX_PARALLEL_TOOLS_BOUNDS),
    default=DEFAULT_MAX_PARALLEL_TOOLS,
    show_default=True,
    metavar="N",
    help="calls of one model step that run at once (only tools declared parallel; 1: one at a time)",
)
@click.option(
    "--stream/--no-stream",
    default=None,
    help="stream each step's text to `session show --follow` as it arrives "
    "[default: on for --model, off for --script]",
)
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
    "--context-window",
    type=int,
    default=None,
    metavar="TOKENS",
    help="the model's context window (default: the known model's); past it less the reserve, the "
    "history is compacted first",
)
@click.option(
    "--context-reserve",
    type=int,
    default=None,
    metavar="TOKENS",
    help="tokens kept free below the window (default: a fifth of it, or --max-tokens if larger)",
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
@click.option(
    "--offer",
    "offer",
    multiple=True,
    metavar="SET",
    help="the tools the model is offered (repeatable or comma-separated): builtins, melra, user, mcp, "
    "mcp:SERVER or a tool's name; default every tool the worker serves (the policy's offeredTools bounds it)",
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
    tool_mode: str,
    max_parallel_tools: int,
    stream: bool | None,
    max_steps: int,
    system: str | None,
    temperature: float | None,
    max_tokens: int | None,
    context_window: int | None,
    context_reserve: int | None,
    step_timeout: float,
    host: str | None,
    offer: tuple[str, ...],
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
    s = settings(db=db, task_queue=task_queue, wait_timeout=wait_timeout, host=host)

    given = SessionStart.of(
        workspace=workspace,
        message=message,
        script=script,
        model=model,
        policy=policy_file,
        session_id=session_id,
        system=system,
        temperature=temperature,
        max_tokens=max_tokens,
        step_timeout=step_timeout,
        context_window=context_window,
        context_reserve=context_reserve,
        model_step_mode=model_step_mode,
        tool_mode=tool_mode,
        max_parallel_tools=max_parallel_tools,
        stream=stream,
        max_steps=max_steps,
        continue_as_new_after=continue_as_new_after,
        continue_as_new_after_steps=continue_as_new_after_steps,
        principal=principal,
        on_behalf_of=on_behalf_of,
        unhinged=unhinged,
        offer=offer or None,
    )
    sessions = SessionClient(None, ledger=s.ledger, task_queue=s.task_queue)
    new = sessions.check_start(given, host=s.host)  # every input refused before connecting, once

    async def main() -> int:
        from maka_temporal.workers.client.connect import connect  # the command boundary: cli/__init__

        sessions.client = await connect(address, namespace)
        # The id first (stderr: stdout keeps its one answer), then, if the first message is not
        # accepted within seconds and no worker polls the queue, that: never a silent wait.
        say(f"session {new.session_id}: starting on task queue {s.task_queue!r}", err=True)
        watch = asyncio.create_task(
            warn_while_unpolled(sessions.client, new.session_id, s.task_queue, lambda m: say(m, err=True))
        )
        try:
            started = await sessions.start_with(new, accept_timeout=s.wait_timeout)
        finally:
            watch.cancel()
        return await _after_send(sessions, started, wait=wait, as_json=as_json, wait_timeout=s.wait_timeout)

    finish(run_async(main()))


@click.command("send")
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
    s = settings(db=db, wait_timeout=wait_timeout)

    async def main() -> int:
        # Lazy: a bad message is refused without a server.
        sessions = await SessionClient.connect(
            address, namespace, ledger=s.ledger, task_queue=s.task_queue, lazy=True
        )
        accepted = await sessions.send(session_id, message, accept_timeout=s.wait_timeout)
        return await _after_send(sessions, accepted, wait=wait, as_json=as_json, wait_timeout=s.wait_timeout)

    finish(run_async(main()))


async def _after_send(
    sessions: SessionClient,
    accepted: TurnStarted,
    *,
    wait: bool,
    as_json: bool,
    wait_timeout: float | None = None,
) -> int:
    if not wait:
        if as_json:
            print_json(
                {
                    "ok": True,
                    "sessionId": accepted.session_id,
                    "turnId": accepted.turn_id,
                    "runId": accepted.run_id,
                    "invocationId": accepted.invocation_id,
                },
                indent=2,
            )
        else:
            say(f"session {accepted.session_id}: turn {accepted.turn_id} accepted (run {accepted.run_id})")
        return 0
    with WaitLine() as line:
        st = await sessions.wait(
            accepted.session_id,
            accepted.run_id,
            timeout=wait_timeout,
            on_progress=lambda p: line.show(p.state, p.elapsed_s),
        )
        line.done(st.state)
    _print_status(st, as_json=as_json)
    return 0 if st.state == "idle" else 1


def _print_status(st: Status, *, as_json: bool) -> None:
    """A session's status as ``session status`` prints it (``send --wait`` and ``start --wait`` too)."""
    for note in st.notes:
        say(note, err=True)
    if as_json:
        print_json(st.raw, indent=2)
        return
    _print_view(st, state=st.state)
    if st.host is not None:
        host_wait = st.raw["hostWait"]
        say(f"host {st.host}" + (f"  (host wait {host_wait:g}s)" if host_wait else ""))
    for p in st.pending_approvals:
        say(f"awaiting approval {p['approvalId']}  {p['toolName']}  phrase: {p['phrase']}")
    for op in st.raw["parkedOperations"]:
        tool = printable(op["toolName"] or "")
        say(f"parked call {op['operationId']}  {tool}  {op['status']}: {op['reason']}")
    health = st.raw["ledger"]
    if not health["ok"]:
        say(f"ledger unusable ({health['code']}): {health['message']}")


def _print_view(view: Any, *, state: str | None = None) -> None:
    """``state``: what the status knows beyond the view (``awaiting_approval``), as ``--json`` says."""
    head = f"session {view.session_id}  state={state or view.state}" + (
        f"  park={view.park_reason}" if view.park_reason else ""
    )
    if not stdout_is_tty():  # a pipe or a log: one fact a line
        say(head)
        for t in view.turns:
            parked = f" ({t.park_reason})" if t.park_reason else ""
            say(f"  turn {t.turn_id}  run {t.run_id}  {t.status}{parked}")
        for o in view.operations:
            say(f"  op {o.operation_id}  {printable(o.tool_name):<10} {o.status:<26} {o.reason}")
        return
    out = console()
    out.print(cell(head))
    turns = Table("turn", "run", "status", "park reason", title="turns", title_justify="left")
    for t in view.turns:
        turns.add_row(cell(t.turn_id), cell(t.run_id), cell(t.status), cell(t.park_reason))
    out.print(turns)
    if view.operations:
        ops = Table("operation", "tool", "status", "reason", title="tool calls", title_justify="left")
        for o in view.operations:
            ops.add_row(cell(o.operation_id), cell(o.tool_name), cell(o.status), cell(o.reason))
        out.print(ops)


@click.command("status")
@db_option
@temporal_options(queue=False)
@click.argument("session_id", metavar="SESSION")
@json_option()
def cmd_status(
    db: str | None, address: str | None, namespace: str | None, session_id: str, as_json: bool
) -> None:
    """State, turns and every tool call's facts."""
    s = settings(db=db)

    async def main() -> int:
        # An unreachable server: the ledger still answers, and the status says why.
        sessions = await SessionClient.connect(
            address, namespace, ledger=s.ledger, timeout=LEDGER_FALLBACK_S, ledger_only_when_unreachable=True
        )
        _print_status(await sessions.status(session_id), as_json=as_json)
        return 0

    finish(run_async(main()))


@click.command("show")
@db_option
@click.argument("session_id", metavar="SESSION")
@json_option("the events as JSON lines")
@click.option(
    "--follow", is_flag=True, help="print facts as they commit, until the session's current turn settles"
)
@click.option(
    "--run",
    "run_id",
    metavar="RUN_ID",
    help="with --follow: wait for this run (the one `session send` printed) and follow it until it settles",
)
def cmd_show(db: str | None, session_id: str, as_json: bool, follow: bool, run_id: str | None) -> None:
    """The transcript, from the ledger."""
    if follow:

        def write(line: str) -> None:
            if as_json:  # each event's canonical text, as the ledger holds it
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
            else:
                say_text(line)

        async def follow_lines() -> None:
            sessions = SessionClient(None, ledger=settings(db=db).ledger)
            async for line in sessions.follow(session_id, run_id, as_json=as_json):
                write(line.text)

        asyncio.run(follow_lines())
        return
    if run_id is not None:
        raise click.UsageError("--run needs --follow")
    shown = asyncio.run(SessionClient(None, ledger=settings(db=db).ledger).show(session_id))
    if as_json:
        for event in shown.events:  # each event's canonical text, as the ledger holds it
            sys.stdout.write(canonical_json.dumps(event) + "\n")
    else:
        for line in shown.lines:
            say_text(line)


@click.command("resolve")
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
    """Record an operator's resolution of a parked operation (append-only); the session's open
    execution is then woken and goes on once every parked call of its turn is settled."""

    async def main() -> Any:
        sessions = await SessionClient.connect(
            ledger=settings(db=db).ledger,
            timeout=LEDGER_FALLBACK_S,
            lazy=True,
            ledger_only_when_unreachable=True,
        )
        return await sessions.resolve(
            session_id,
            operation_id,
            decision=decision,  # type: ignore[arg-type]
            by=resolved_by,
            reason=reason,
        )

    recorded: dict[str, Any] = {}

    async def resolved() -> int:  # run_async: a command that talked to Temporal leaves hard
        recorded.update((await main()).raw)
        return 0

    run_async(resolved())
    if as_json:
        print_json({"ok": True, **recorded}, indent=2)
        return
    then = {
        "sent": "its execution was woken and goes on once every parked call of the turn is settled "
        f"(`maka session status {session_id}`)",
        "execution_closed": f"its execution has closed: now `maka resume {session_id}`",
    }.get(recorded["wake"], f"no server answered the wake-up: `maka resume {session_id}` sends it again")
    say(
        f"session {session_id}: operation {operation_id} resolved {decision} by {resolved_by} "
        f"(answers {recorded['parkedEventId']}); {then}"
    )


def _tokens(text: str | None, option: str) -> int | None:
    """A cap as typed: digits only (a sign, a decimal or a word is ``config_invalid``, never guessed)."""
    if text is None:
        return None
    if not text.isascii() or not text.isdigit():
        raise ConfigError("config_invalid", f"{option} must be a whole number of tokens", option=option)
    return int(text)


@click.command("raise-limit")
@db_option
@click.argument("session_id", metavar="SESSION")
@click.option(
    "--max-tokens-per-session", "per_session", metavar="N", help="the new usage.maxTokensPerSession"
)
@click.option("--max-tokens-per-turn", "per_turn", metavar="N", help="the new usage.maxTokensPerTurn")
@click.option("--by", "raised_by", required=True, metavar="NAME", help="who raises it (recorded)")
@click.option("--reason", required=True, metavar="TEXT", help="why (recorded)")
@json_option()
def cmd_raise_limit(
    db: str | None,
    session_id: str,
    per_session: str | None,
    per_turn: str | None,
    raised_by: str,
    reason: str,
    as_json: bool,
) -> None:
    """Raise a spent token cap of the session's policy (an operator's fact, append-only); then
    `maka resume SESSION` (it wakes the parked execution, which goes on)."""
    caps = {
        field: value
        for field, value in (
            ("maxTokensPerSession", _tokens(per_session, "--max-tokens-per-session")),
            ("maxTokensPerTurn", _tokens(per_turn, "--max-tokens-per-turn")),
        )
        if value is not None
    }
    sessions = SessionClient(None, ledger=settings(db=db).ledger)
    raised = asyncio.run(sessions.raise_limit(session_id, caps=caps, by=raised_by, reason=reason)).raw
    if as_json:
        print_json({"ok": True, **raised}, indent=2)
    else:
        what = ", ".join(f"usage.{k} {raised['previous'][k]} -> {v}" for k, v in raised["caps"].items())
        say(
            f"session {session_id}: {what} raised by {raised_by} (the next call is estimated at about "
            f"{raised['nextCall']} tokens); now `maka resume {session_id}`"
        )


add_commands(
    session,
    cmd_start,
    cmd_send,
    cmd_status,
    cmd_list,
    cmd_show,
    cmd_resolve,
    cmd_approve,
    cmd_deny,
    cmd_session_receipts,
    cmd_cancel,
    cmd_raise_limit,
)
