"""A worker whose bash sandbox takes the worker's PATH verbatim and whose classifier takes a read's
name on trust, as before issue 37: the planted-program drill's negative control.

It is ``maka worker`` in every respect but two, put back in this process only: the sandbox's PATH is
the worker's as it is (a folder inside the workspace, a relative entry, included), and a command
line is classified without asking where its names resolve. No production process can select it.

Run: ``python -m tests.children.verbatim_path_worker --db DB --task-queue Q --tool-heartbeat-timeout S``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from maka_core.governance import classify, commands
from maka_core.tools import shell
from maka_core.tools.programs import DEFAULT_PATH
from maka_core.tools.sandbox import ENV_ALLOWLIST
from maka_temporal.workers.cli.app import main


def verbatim_env(home: str, source: Mapping[str, str] | None = None) -> dict[str, str]:
    """The old ``minimal_env``: the worker's PATH as it is."""
    src = os.environ if source is None else source
    env = {"PATH": src.get("PATH") or DEFAULT_PATH, "HOME": home, "LANG": src.get("LANG") or "C.UTF-8"}
    env |= {"TERM": "dumb", **{k: src[k] for k in ENV_ALLOWLIST if k in src}}
    return env


def by_name(line: str, runs: object = None) -> commands.CommandLine:
    """The old parse: a read's name is taken to be the system's program."""
    return commands.parse_command_line(line)


if __name__ == "__main__":
    shell.minimal_env = verbatim_env  # type: ignore[assignment]
    classify.parse_command_line = by_name  # type: ignore[assignment]
    sys.exit(main(["worker", *sys.argv[1:]]))
