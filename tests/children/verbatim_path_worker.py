"""A worker whose bash sandbox gets the PATH as main gave it: the 37.4 drill's negative control.

It is ``maka worker`` in every respect but two, put back as they were in this process only: the
sandbox's PATH is the worker's, copied verbatim (``programs.SearchPath.of``), and the classifier
judges a command by its name without looking up the program it runs (``classify.located``). No
production process can select it: it exists only for ``tests/test_trusted_read_path_attack.py``.

Run: ``python -m tests.children.verbatim_path_worker --db DB --task-queue Q --tool-heartbeat-timeout S``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from maka_core.governance import classify
from maka_core.governance.commands import CommandLine, ProgramLookup
from maka_core.tools.programs import DEFAULT_PATH, SearchPath
from maka_temporal.workers.cli.app import main


def verbatim(cls: type[SearchPath], raw: str | None, hidden: Iterable[Path] = ()) -> SearchPath:
    """main's sandbox PATH: the worker's own, entry for entry."""
    return cls(tuple((raw or DEFAULT_PATH).split(":")))


def by_name(line: CommandLine, lookup: ProgramLookup) -> CommandLine:
    """main's classifier: a name is the command it names, whatever program it runs."""
    return line


if __name__ == "__main__":
    SearchPath.of = classmethod(verbatim)  # type: ignore[assignment]
    classify.located = by_name
    sys.exit(main(["worker", *sys.argv[1:]]))
