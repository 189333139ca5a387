"""What every ``maka`` command shares: options declared once, settings, the ledger, output, refusals.

A refusal is a ``MakaError`` raised anywhere below a command; the root group prints it once
(``refusal``) and exits 2: ``error: <code>: <message>`` on stderr, or under ``--json`` one JSON object
``{"ok": false, "code", "message", ...}`` on stdout. Expected failures never show a traceback.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from maka_core.errors import MakaError, StoreError
from maka_core.settings import MakaSettings, load_settings

if TYPE_CHECKING:
    from maka_core.store.writer import LedgerStore

F = TypeVar("F", bound=Callable[..., Any])

JSON_META = "maka_json"
#: Set once a command has talked to Temporal: the console entry point then leaves without
#: interpreter finalization (see ``workers.cli.app.main``).
TEMPORAL_USED = "maka_temporal_used"


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


def settings(**flags: Any) -> MakaSettings:
    """The settings for this command (environment + the flags given); refuses ``config_invalid``."""
    return load_settings(**flags)


# --- output ------------------------------------------------------------------------------------


def json_mode() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get(JSON_META))


def print_json(value: Any, *, indent: int | None = None) -> None:
    sys.stdout.write(json.dumps(value, ensure_ascii=False, indent=indent, default=str) + "\n")
    sys.stdout.flush()


def print_line(obj: dict[str, Any]) -> None:
    """One compact JSON object on one line (lifecycle events of long-running commands)."""
    print(json.dumps(obj), flush=True)


def refusal(error: MakaError, as_json: bool) -> None:
    """The one refusal printer."""
    if as_json:
        print_json({"ok": False, "code": error.code, "message": error.message, **error.detail})
    else:
        sys.stderr.write(f"error: {error.code}: {error.message}\n")
        sys.stderr.flush()


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()


def console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


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


# --- the ledger --------------------------------------------------------------------------------


def open_ledger(target: str | Path, *, create: bool) -> LedgerStore:
    """Open the ledger at a path or URL; refuses instead of raising a store traceback.

    Only the commands that run turns (worker, dev, demo, session start) and ``ledger import`` may
    create it; every reader refuses a missing file (``ledger_not_found``) rather than leaving an
    empty database behind.

    Raises:
        MakaError: ``ledger_not_found``, ``store_unreadable`` (a directory, not SQLite, unreachable),
            ``schema_too_new``.
    """
    from sqlalchemy.exc import SQLAlchemyError

    from maka_core.store.engine import database_url, sqlite_file
    from maka_core.store.writer import LedgerStore

    file = sqlite_file(database_url(target))
    if file is not None:
        if file.is_dir():
            raise StoreError("store_unreadable", f"{file} is a directory, not a ledger", path=str(file))
        if not create and not file.exists():
            raise MakaError("ledger_not_found", f"no ledger at {file}", path=str(file))
    try:
        return LedgerStore.open(target)
    except SQLAlchemyError as exc:
        raise StoreError(
            "store_unreadable", f"cannot open the ledger: {exc.__class__.__name__}: {exc}"
        ) from None


def session_events(target: str | Path, session_id: str, *, run_id: str | None = None) -> list[Any]:
    """A stored session's events (of one run, when given), read-only.

    Raises:
        MakaError: ``session_not_found`` when the ledger holds none; ``open_ledger``'s codes.
    """
    with open_ledger(target, create=False) as store:
        events: list[Any] = store.events(session_id=session_id, run_id=run_id)
    if not events:
        raise MakaError("session_not_found", f"no events for session {session_id}", sessionId=session_id)
    return events


def ensure_utf8(text: str, what: str) -> str:
    """Refuse text that did not decode as UTF-8 (arguments arrive with surrogate escapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise MakaError(f"{what}_invalid", f"the {what} is not valid UTF-8") from None
    return text
