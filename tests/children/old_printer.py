"""``maka`` with the text printers as they were before ``maka_core.facts.printable``: strings are
printed as they came and Rich reads markup in them. The negative control of
``tests/test_text_output.py``; no production process can select it.

It swaps the escape functions for the identity and the console for the old one *before* any
command module is imported (each binds the names at its import), then runs ``maka`` as the console
entry point does.

Run: ``python -m tests.children.old_printer ARGS...`` (the arguments of ``maka``).
"""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console

import maka_core.facts.printable as printable


def _as_is(value: object) -> str:
    return value if isinstance(value, str) else str(value)


def _old_console(stderr: bool = False) -> Any:
    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def main() -> int:
    printable.printable = _as_is  # type: ignore[assignment]
    printable.printable_block = _as_is  # type: ignore[assignment]
    printable.printable_json = _as_is  # type: ignore[assignment]
    from maka_temporal.workers.cli import base

    base.console = _old_console
    base.cell = _as_is  # type: ignore[assignment]
    from maka_temporal.workers.cli.app import main as maka

    return maka(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
