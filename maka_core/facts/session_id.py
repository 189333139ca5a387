"""The one rule for a session id maka admits: ``--session-id`` and ``ledger import`` share it.

A session id names a workflow id (``maka-session-<id>``), log lines and table rows: no blanks, no
controls, bounded.
"""

from __future__ import annotations

import re
from typing import Final

from maka_core.errors import MakaError

SESSION_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}")


def check_session_id(value: str, **detail: object) -> str:
    """Return ``value`` if it is a session id maka admits.

    Raises:
        MakaError: ``session_id_invalid`` (with ``sessionId`` and ``detail``).
    """
    if not SESSION_ID.fullmatch(value):
        raise MakaError(
            "session_id_invalid",
            "a session id is 1-200 letters, digits, '.', '_', ':', '@' or '-', "
            "starting with a letter or digit",
            sessionId=value,
            **detail,
        )
    return value
