"""A worker with the bash guarantee as it was before issue 23: the attack drill's negative control.

It is ``maka worker`` in every respect but the derivation of a ``bash`` call's guarantee, which it
puts back as it was, in this process only: the line is read by the ``shlex`` parser
(``tests/shlex_command_line.py``), and a call classified as a read is ``read-only`` whatever its
tool's recovery mode. No production process can select it: it exists only for
``tests/test_bash_rerun_attack.py``.

Run: ``python -m tests.children.shlex_worker --db DB --task-queue Q --tool-heartbeat-timeout S``.
"""

from __future__ import annotations

import sys

from maka_core.facts.events import RecoveryMode
from maka_core.governance import classify
from maka_core.governance.guarantee import ExecutionGuarantee, derive_guarantee
from maka_core.runtime import governed
from maka_core.tools.base import Effect
from maka_temporal.workers.cli.app import main
from tests.shlex_command_line import shlex_parse_command_line


def parse_guaranteed_read(
    effect: Effect, recovery_mode: RecoveryMode, *, trusted: bool = False
) -> ExecutionGuarantee:
    """The old ``guarantee_for_tool``: the parse alone makes a bash line ``read-only``."""
    return derive_guarantee(effect, declares_reconciliation=recovery_mode == "reconcile")


if __name__ == "__main__":
    classify.parse_command_line = shlex_parse_command_line  # type: ignore[assignment]
    governed.guarantee_for_tool = parse_guaranteed_read
    sys.exit(main(["worker", *sys.argv[1:]]))
