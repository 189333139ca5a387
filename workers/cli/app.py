"""The ``maka`` command: one Click group whose command groups live in their own modules.

Exit codes: 0 success, 1 a check found differences or a session failed, 2 refused input (printed
by ``workers.cli.base.refusal``; a JSON object on stdout under ``--json``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

import click

from maka_core.errors import MakaError
from maka_temporal.workers.cli.base import JSON_META, TEMPORAL_USED, refusal, say_text

#: Whether ``--json`` was on the command line: a usage error stops Click before the flag's own
#: callback runs, and the refusal must still come out in the mode the caller asked for.
ARGV_JSON = "maka_argv_json"

#: Every top-level command, declared once: where it lives (a module, relative to this package) and the
#: line ``maka --help`` lists. A command's module is imported only when that command is run (or
#: asked for its own help), so ``maka --help`` loads no store, runtime or Temporal client (pip's
#: ``commands_dict`` does the same). ``tests/test_cli_startup.py`` holds each line equal to its
#: command's own first help line.
COMMANDS: dict[str, tuple[str, str]] = {
    "audit": (
        ".audit:cmd_audit",
        "Did Temporal and the ledger tell the same story? (exit 0 agree, 1 drift, 2 refused)",
    ),
    "console": (
        ".console:cmd_console",
        "A local web console: sessions, live transcripts, approvals, resolutions.",
    ),
    "demo": (".host:cmd_demo", "Run a scripted session on a sample workspace."),
    "dev": (".host:cmd_dev", "Run the embedded Temporal dev server (+ a worker)."),
    "ledger": (".ledger:ledger", "Import, export, plan and verify a RuntimeEvent ledger."),
    "receipts": (".governance:receipts", "Exported receipts."),
    "resume": (
        ".resume:cmd_resume",
        "Continue a session whose workflow execution is lost, through the planner (never a retry), or",
    ),
    "session": (".session:session", "Start, message and inspect sessions."),
    "worker": (".host:cmd_worker", "Run a worker: startup repair, then poll."),
}


class MakaGroup(click.Group):
    """The root group: every refusal and usage error becomes one printed refusal and exit 2; its
    commands load on first use (``COMMANDS``)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attr = COMMANDS[cmd_name][0].split(":")
            self.add_command(getattr(importlib.import_module(module, __package__), attr), cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The listing from ``COMMANDS`` alone, truncated as Click truncates a command's own line."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [
            (name, click.Command(name, help=line).get_short_help_str(limit))
            for name, (_, line) in sorted(COMMANDS.items())
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        options = args[: args.index("--")] if "--" in args else args
        ctx.meta[ARGV_JSON] = "--json" in options
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MakaError as exc:
            refusal(exc, _json_asked(ctx))
            ctx.exit(2)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.BadParameter as exc:
            if isinstance(exc, click.MissingParameter):
                self._usage(ctx, exc)
            # A value the command cannot take (a port out of range, a number that is not one).
            name = exc.param.opts[0] if exc.param is not None and exc.param.opts else "value"
            err = MakaError("config_invalid", exc.format_message(), setting=name)
            refusal(err, _json_asked(ctx))
            ctx.exit(2)
        except click.UsageError as exc:
            self._usage(ctx, exc)

    @staticmethod
    def _usage(ctx: click.Context, exc: click.UsageError) -> None:
        as_json = _json_asked(ctx)
        if not as_json and exc.ctx is not None:
            say_text(exc.ctx.get_usage(), err=True)
        refusal(MakaError("usage_invalid", exc.format_message()), as_json)
        ctx.exit(2)


def _json_asked(ctx: click.Context) -> bool:
    return bool(ctx.meta.get(JSON_META) or ctx.meta.get(ARGV_JSON))


@click.group(cls=MakaGroup, context_settings={"help_option_names": ["-h", "--help"]})
def maka() -> None:
    """Durable agent sessions on Temporal; the RuntimeEvent ledger is the authority on tool outcomes."""


def main(argv: Sequence[str] | None = None) -> int:
    """The console entry point: run ``maka``, then leave with its exit code.

    After a command that talked to Temporal the process leaves without interpreter finalization:
    the Temporal core runs Rust threads that may still call back into Python for a moment after the
    event loop closes, and finalizing under them can crash the process after a correct run.
    """
    args = list(argv) if argv is not None else sys.argv[1:]
    meta: dict[str, Any] = {}
    try:
        with maka.make_context("maka", args) as ctx:
            meta = ctx.meta
            result = maka.invoke(ctx)
        code = int(result) if isinstance(result, int) else 0
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.exceptions.NoArgsIsHelpError as exc:
        say_text(exc.ctx.get_help() if exc.ctx is not None else exc.message, err=True)
        code = 2
    except click.UsageError as exc:  # an unknown command or option on the root group itself
        as_json = "--json" in args
        if not as_json and exc.ctx is not None:
            say_text(exc.ctx.get_usage(), err=True)
        refusal(MakaError("usage_invalid", exc.message), as_json)
        code = 2
    except click.Abort:
        code = 130
    except BrokenPipeError:
        code = _broken_pipe()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        code = _broken_pipe()
    if meta.get(TEMPORAL_USED) and not os.environ.get("MAKA_NO_HARD_EXIT"):
        os._exit(code)
    return code


def _broken_pipe() -> int:
    """The reader left (``maka session status | head``): not an error of ours, and no traceback."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
