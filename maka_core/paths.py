"""Where maka keeps its files: everything under ``MAKA_HOME`` (default ``~/.maka``)."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_TASK_QUEUE = "maka"


def maka_home() -> Path:
    """The root for the ledger, the dev server's database and logs."""
    return Path(os.environ.get("MAKA_HOME") or Path.home() / ".maka").expanduser()


def default_ledger_path() -> Path:
    """The ledger the worker and every ``maka`` command use unless ``--db`` says otherwise."""
    return maka_home() / "ledger.sqlite"


def default_task_queue() -> str:
    """One task queue shared by ``maka worker`` and ``maka session`` (``MAKA_TASK_QUEUE``)."""
    return os.environ.get("MAKA_TASK_QUEUE") or DEFAULT_TASK_QUEUE
