"""``maka console [--port P] [--host 127.0.0.1] [--read-only]``: the local web console
(``workers.console``) over the same ledger and Temporal as every other command, through
``SessionClient``. It binds loopback by default; any other address needs the access token
(``MAKA_CONSOLE_TOKEN``, else one made and printed once at start). Temporal is connected lazily and a
server that does not answer leaves the console ledger-only (pages still show the ledger; actions
that need Temporal refuse with its code).
"""

from __future__ import annotations

import asyncio
import os
import secrets

import click
import uvicorn

from maka_core.errors import ConfigError
from maka_temporal.workers.cli.base import db_option, say, settings, temporal_options
from maka_temporal.workers.client.session_api import SessionClient
from maka_temporal.workers.console.app import build_app
from maka_temporal.workers.console.guard import Guard, is_loopback

__all__ = ["cmd_console"]

CONNECT_S = 5.0


@click.command("console")
@db_option
@temporal_options()
@click.option("--host", "bind", default="127.0.0.1", show_default=True, help="the address to bind")
@click.option("--port", default=8580, show_default=True, type=int, help="the port to serve on")
@click.option(
    "--read-only", is_flag=True, help="show no buttons and refuse every action (403 console_read_only)"
)
@click.option(
    "--operator",
    envvar="MAKA_OPERATOR",
    default=None,
    metavar="NAME",
    help="the name actions record as who took them, unless a form names another [env: MAKA_OPERATOR]",
)
def cmd_console(
    db: str | None,
    address: str | None,
    namespace: str | None,
    task_queue: str | None,
    bind: str,
    port: int,
    read_only: bool,
    operator: str | None,
) -> None:
    """A local web console: sessions, live transcripts, approvals, resolutions."""

    s = settings(db=db)
    token = None
    if not is_loopback(bind):
        token = os.environ.get("MAKA_CONSOLE_TOKEN") or secrets.token_urlsafe(24)
        if len(token) < 16:
            raise ConfigError("config_invalid", "MAKA_CONSOLE_TOKEN must be at least 16 characters")
        if "MAKA_CONSOLE_TOKEN" not in os.environ:
            say(f"access token (shown once): {token}", err=True)
    client = asyncio.run(
        SessionClient.connect(
            address,
            namespace,
            ledger=s.ledger,
            task_queue=task_queue,
            timeout=CONNECT_S,
            ledger_only_when_unreachable=True,
        )
    )
    named = (operator or "").strip() or None
    app = build_app(client, Guard(token=token, read_only=read_only), operator=named)
    say(f"maka console on http://{bind}:{port}/ ({'read-only' if read_only else 'read-write'})", err=True)
    uvicorn.run(app, host=bind, port=port, log_level="warning")
