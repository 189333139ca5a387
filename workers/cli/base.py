"""What every ``maka`` command shares: options declared once, settings, output, refusals (the
ledger is opened through ``workers.client.ledger``, which every room uses).

A refusal is a ``MakaError`` raised anywhere below a command; the root group prints it once
(``refusal``) and exits 2: ``error: <code>: <message>`` on stderr, or under ``--json`` one JSON object
``{"ok": false, "code", "message", ...}`` on stdout. Expected failures never show a traceback.

Text output goes through the printers here, never ``click.echo`` or ``print`` in a command: ``say``
prints one line, ``say_text`` a text whose lines are meant (a transcript), ``cell`` is a Rich
table's cell, ``print_json`` the JSON. Each shows what a model, a vendor, a tool, an MCP server or
an operator chose through ``maka_core.facts.printable``: a newline, an escape sequence or a bidi
control in a tool name is shown escaped (``\\n``, ``\\x1b``, ``\\u202e``), never obeyed, and Rich reads
no markup (``[bold]``, ``[link=...]``) or emoji code in it. ``tests/test_text_output.py`` holds
every text command to it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.text import Text

from maka_core.errors import MakaError
from maka_core.facts.printable import printable, printable_block, printable_json
from maka_core.settings import MakaSettings, load_settings

F = TypeVar("F", bound=Callable[..., Any])

JSON_META = "maka_json"
#: Set once a command has talked to Temporal: the console entry point then leaves without
#: interpreter finalization (see ``workers.cli.app.main``).
TEMPORAL_USED = "maka_temporal_used"
#: How long ``audit`` and ``session cancel`` wait for the server to answer their connect.
CONNECT_S = 10.0
#: How long ``session status``, ``approve`` and ``deny`` wait before they answer from the ledger alone.
LEDGER_FALLBACK_S = 3.0


# --- options (declared once) -------------------------------------------------------------------


def _remember_json(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    ctx.meta[JSON_META] = bool(value) or bool(ctx.meta.get(JSON_META))
    return value


def json_option(help: str = "machine-readable output on stdout") -> Callable[[F], F]:
    # Eager, so a refusal raised while the other options are parsed already knows the output mode.
    return click.option("--json", "as_json", is_flag=True, is_eager=True, callback=_remember_json, help=help)


db_option = click.option(
    "--db",
    default=None,
    metavar="PATH|URL",
    help="ledger: a SQLite file or a SQLAlchemy URL such as postgresql+psycopg://... "
    "(default: MAKA_DB, else $MAKA_HOME/ledger.sqlite)",
)


def temporal_options(*, queue: bool = True) -> Callable[[F], F]:
    """``--address``, ``--namespace`` (and ``--task-queue``) for commands that talk to Temporal."""

    def wrap(fn: F) -> F:
        if queue:
            fn = click.option(
                "--task-queue", default=None, help="task queue (default: MAKA_TASK_QUEUE or 'maka')"
            )(fn)
        fn = click.option(
            "--namespace", default=None, help="Temporal namespace (default: TEMPORAL_NAMESPACE)"
        )(fn)
        fn = click.option(
            "--address", default=None, help="Temporal frontend host:port (default: TEMPORAL_ADDRESS)"
        )(fn)
        return fn

    return wrap


def add_commands(group: click.Group, *commands: click.Command) -> None:
    """A group's commands, listed once at the end of the group's module: every command is a plain
    ``@click.command`` and its group names it here (the root group's are ``app.COMMANDS``)."""
    for command in commands:
        group.add_command(command)


def settings(**flags: Any) -> MakaSettings:
    """The settings for this command (environment + the flags given); refuses ``config_invalid``."""
    return load_settings(**flags)


# --- output ------------------------------------------------------------------------------------


def json_mode() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get(JSON_META))


def print_json(value: Any, *, indent: int | None = None) -> None:
    """``value`` as JSON on stdout. Non-ASCII text stays readable, but the characters a terminal
    would obey or reorder (``printable.UNSAFE``: C1 controls, bidi controls, line separators,
    lone surrogates) are written as ``\\uXXXX`` escapes: the same JSON value, inert on a screen."""
    text = json.dumps(value, ensure_ascii=False, indent=indent, default=str)
    sys.stdout.write(printable_json(text) + "\n")
    sys.stdout.flush()


def print_line(obj: dict[str, Any]) -> None:
    """One compact JSON object on one line (lifecycle events of long-running commands)."""
    print(json.dumps(obj), flush=True)


def refusal(error: MakaError, as_json: bool) -> None:
    """The one refusal printer."""
    if as_json:
        print_json({"ok": False, "code": error.code, "message": error.message, **error.detail})
    else:
        say(f"error: {error.code}: {error.message}", err=True)


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()


def console(stderr: bool = False) -> Any:
    """A Rich console that reads no markup and no emoji codes in what it prints (a model's
    ``[link=...]`` prints as typed); its cells are ``cell``s."""
    return Console(stderr=stderr, highlight=False, soft_wrap=True, markup=False, emoji=False)


def say(line: object = "", *, err: bool = False) -> None:
    """Print one line of text output (stdout, or stderr with ``err``): ``printable``, so a string
    someone else chose shows escaped and the line stays one line."""
    click.echo(printable(line), err=err)


def say_text(text: str, *, err: bool = False) -> None:
    """Print a text whose newlines and tabs are meant (a transcript line, a help text): every other
    control and bidi character shown escaped (``printable_block``)."""
    click.echo(printable_block(text), err=err)


def cell(value: object) -> Text:
    """A Rich table cell: the value as one printable line, literal (never markup)."""
    return Text(printable("" if value is None else value))


#: In a log, a wait prints a line per state change, otherwise one every this many seconds.
LOG_EVERY_S = 10.0


class WaitLine:
    """A wait's progress on stderr, as ``SessionClient.wait`` and ``resume`` report it: a
    self-updating Rich status line on a terminal, otherwise log lines (``[  3.2s] running``). Use it
    as a context manager; ``show`` is the listener (the first call starts the line), ``done``
    prints the settled state."""

    def __init__(self) -> None:
        self._began = time.monotonic()
        self._last: tuple[str, float] = ("", -LOG_EVERY_S)
        self._live: Any = None

    def __enter__(self) -> WaitLine:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop()

    def show(self, state: str, elapsed: float | None = None) -> None:
        """The state now; ``elapsed``: seconds since the wait began (default: since this line began)."""
        if elapsed is None:
            elapsed = time.monotonic() - self._began
        if sys.stderr.isatty():
            if self._live is None:
                self._live = console(stderr=True).status("")
                self._live.start()
            self._live.update(Text(printable(f"[{elapsed:5.1f}s] {state}…")))
        elif state != self._last[0] or elapsed - self._last[1] >= LOG_EVERY_S:
            say(f"[{elapsed:5.1f}s] {state}", err=True)
            self._last = (state, elapsed)

    def done(self, state: str) -> None:
        self._stop()
        say(f"[{time.monotonic() - self._began:5.1f}s] {state}", err=True)

    def _stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


# --- running -----------------------------------------------------------------------------------


def run_async(main: Coroutine[Any, Any, int]) -> int:
    """Run a command's coroutine to its exit code."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[TEMPORAL_USED] = True
    return int(asyncio.run(main) or 0)


def finish(code: int) -> None:
    """Leave the command with ``code`` (Click's way, so CliRunner sees it too)."""
    if code:
        raise click.exceptions.Exit(code)


wait_timeout_option = click.option(
    "--wait-timeout",
    type=float,
    default=None,
    metavar="SECONDS",
    help="give up waiting after this long, keeping the session (MAKA_WAIT_TIMEOUT; default 600)",
)
