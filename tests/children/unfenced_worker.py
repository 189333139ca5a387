"""A worker whose file writes never ask their call's fence, as before issue 37: the late-attempt
drills' negative control.

It is ``maka worker`` in every respect but one, put back in this process only: a write tool bound
to its call ignores the fence (``with_fence`` returns the tool unchanged), so an attempt frozen
before its write writes when it wakes, even after recovery settled its call. No production process
can select it.

Run: ``python -m tests.children.unfenced_worker --db DB --task-queue Q --tool-heartbeat-timeout S``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from maka_core.tools.files import _WriteTool
from maka_temporal.workers.cli.app import main


def unfenced(self: Any, live: Callable[[], bool]) -> Any:
    return self


if __name__ == "__main__":
    _WriteTool.with_fence = unfenced  # type: ignore[method-assign]
    sys.exit(main(["worker", *sys.argv[1:]]))
