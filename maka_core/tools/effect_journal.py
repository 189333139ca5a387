"""Drill instrumentation: an append-only, fsynced journal of real file writes.

A crash drill must count side effects exactly, and an identical second write leaves the file
unchanged, so the file alone cannot show a duplicate. When ``MAKA_EFFECT_LOG`` names a file, each
mutating file tool appends one JSON line ``{"tool", "path", "sha256"}`` right after its write lands
(before failpoint P4), fsynced so a SIGKILL an instant later cannot lose it. Unset, ``record`` is one
environment lookup. Production never sets it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Final

ENV: Final = "MAKA_EFFECT_LOG"


def record(tool: str, path: Path, data: bytes) -> None:
    """Append one effect line for ``tool`` having written ``data`` to ``path`` (no-op when unset).

    One ``write`` on an ``O_APPEND`` descriptor, so lines from concurrent processes never interleave.
    """
    target = os.environ.get(ENV)
    if not target:
        return
    line = json.dumps({"tool": tool, "path": str(path), "sha256": hashlib.sha256(data).hexdigest()}) + "\n"
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, line.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
