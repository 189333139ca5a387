"""The ``maka`` command: one entry point whose command groups live in their own modules.

Exit codes: 0 success, 1 a check found differences or a session failed, 2 refused input
(with a JSON error object on stdout under ``--json``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="maka",
        description=(
            "Durable agent sessions on Temporal; the RuntimeEvent ledger is the authority on tool outcomes."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Each group module exposes register(subparsers); the parser it adds sets ``func``.
    from workers import ledger_cli

    ledger_cli.register(sub)
    try:
        from workers import session_cli
    except ImportError:  # the session host is optional while it is being built
        session_cli = None  # type: ignore[assignment]
    if session_cli is not None:
        session_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code = args.func(args)
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
