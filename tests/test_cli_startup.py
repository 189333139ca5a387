"""``maka --help`` loads no command module: the listing comes from ``maka_temporal.workers.cli.app.COMMANDS``.

The start-up cost is measured, not asserted (0.58 s -> 0.19 s, README); what a test can hold is
the cause: which modules a bare ``--help`` imports, and that the declared table tells the truth
about every command it lazily loads.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import click

from maka_temporal.workers.cli import app as cli

#: What ``maka --help`` must not pay for: the store, the runtime, the Temporal client, the commands.
HEAVY = ("sqlalchemy", "temporalio", "maka_core.runtime", "maka_core.store",
         "maka_temporal.workers.cli.session")


def test_each_declared_line_is_its_commands_own_first_help_line() -> None:
    for name, (target, line) in cli.COMMANDS.items():
        module, attr = target.split(":")
        command = getattr(importlib.import_module(module, cli.__package__), attr)
        assert isinstance(command, click.Command), target
        assert command.name == name, (name, command.name)
        assert (command.help or "").splitlines()[0] == line, name


def test_root_help_imports_no_command_module() -> None:
    probe = (
        "import sys, contextlib, io, json\n"
        "from maka_temporal.workers.cli import app as cli\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    code = cli.main(['--help'])\n"
        "print(json.dumps({'code': code, 'help': out.getvalue(), 'modules': sorted(sys.modules)}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    seen = json.loads(done.stdout)
    assert seen["code"] == 0
    loaded = [m for m in seen["modules"] if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert loaded == [], f"maka --help imported {loaded}"
    for name in cli.COMMANDS:
        assert f"\n  {name} " in seen["help"], (name, seen["help"])


def test_a_command_loads_on_first_use_and_lists_its_subcommands() -> None:
    ctx = click.Context(cli.maka)
    session = cli.maka.get_command(ctx, "session")
    assert isinstance(session, click.Group)
    assert {"start", "send", "status", "show", "resolve", "approve", "deny", "receipts"} <= set(
        session.list_commands(ctx)
    )
    assert cli.maka.get_command(ctx, "no-such-command") is None


def test_a_ledger_only_command_runs_without_the_temporal_sdk(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``maka session show`` (through ``SessionClient.show``) reads the ledger alone: the Temporal
    SDK, whose import is most of a session command's start-up, is never loaded (``cli/__init__``).
    It fails if ``session_api`` or a ``session`` command module imports the Temporal side at top."""
    probe = (
        "import sys, json, contextlib, io\n"
        "from maka_temporal.workers.cli import app as cli\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):\n"
        f"    code = cli.main(['session', 'show', 'sess-none', '--db', {str(tmp_path / 'l.sqlite')!r}])\n"
        "sdk = sorted(m for m in sys.modules if m.startswith('temporalio'))\n"
        "print(json.dumps({'code': code, 'modules': sdk}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["code"] == 2, (seen, done.stderr)  # refused: no such ledger
    assert seen["modules"] == [], f"maka session show imported {seen['modules'][:5]}..."
