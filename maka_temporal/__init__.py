"""maka-temporal: durable agent sessions on Temporal that never run a tool twice.

The public face of the library, the only names a user imports::

    from maka_temporal import MakaPlugin, SessionClient, SessionError, connect
    from maka_temporal.workflow import run_session          # inside your workflow code

- ``MakaPlugin``: add it to ``Client.connect(..., plugins=[...])`` (or to your ``Worker``): your
  worker then hosts maka sessions (the session workflow, its activities, startup repair, the host
  queue of its tools).
- ``SessionClient``: start, message, wait for, inspect, follow, approve, deny, resolve, resume and audit
  sessions from your code; every refusal is a ``SessionError`` whose ``.code`` is the CLI's.
- ``maka_temporal.workflow.run_session``: a session as a child workflow of yours, for one message.
- ``SubAgent``: a sub-agent, offered to the model as the tool ``agent__NAME`` (``MakaPlugin(tools=[...])``):
  its call runs a child session.
- ``connect``: a Temporal client with maka's settings (``TEMPORAL_*``, envconfig profiles) and the
  pydantic data converter.

The installed distribution claims two top-level names, ``maka_temporal`` and ``maka_core``; the
repository's ``workflows``, ``activities`` and ``workers`` folders are installed under this package
(``maka_temporal.workflows`` ...) so a Temporal project with packages of those names keeps them.

The names load on first use (module ``__getattr__``): ``import maka_temporal`` stays light, and
the workflow sandbox, which re-imports ``maka_temporal`` (the parent of ``maka_temporal.workflow``)
for every workflow run, never pulls in the store, the runtime or the Temporal client through it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "ApprovalAnswer",
    "AuditAll",
    "AuditResult",
    "FollowLine",
    "MakaPlugin",
    "NewSession",
    "Operation",
    "Resolution",
    "ResumeProgress",
    "Resumed",
    "SessionClient",
    "SessionError",
    "SessionResult",
    "SessionStart",
    "Status",
    "SubAgent",
    "Transcript",
    "TurnCancelled",
    "TurnInfo",
    "TurnStarted",
    "WaitProgress",
    "connect",
]

#: Where each public name lives (module, attribute), declared once.
_PUBLIC: dict[str, str] = {
    "MakaPlugin": "maka_temporal.workers.host.plugin",
    "SessionResult": "maka_temporal.workflows.child",
    "SubAgent": "maka_core.tools.subagent",
    "NewSession": "maka_temporal.workers.client.session_start",
    "SessionClient": "maka_temporal.workers.client.session_api",
    "SessionStart": "maka_temporal.workers.client.session_start",
    "TurnCancelled": "maka_temporal.workflows.contracts",
    "connect": "maka_temporal.workers.client.connect",
    **{
        name: "maka_temporal.workers.client.answers"
        for name in (
            "ApprovalAnswer",
            "AuditAll",
            "AuditResult",
            "FollowLine",
            "Operation",
            "Resolution",
            "ResumeProgress",
            "Resumed",
            "SessionError",
            "Status",
            "Transcript",
            "TurnInfo",
            "TurnStarted",
            "WaitProgress",
        )
    },
}

if TYPE_CHECKING:
    from maka_core.tools.subagent import SubAgent
    from maka_temporal.workers.client.answers import (
        ApprovalAnswer,
        AuditAll,
        AuditResult,
        FollowLine,
        Operation,
        Resolution,
        Resumed,
        ResumeProgress,
        SessionError,
        Status,
        Transcript,
        TurnInfo,
        TurnStarted,
        WaitProgress,
    )
    from maka_temporal.workers.client.connect import connect
    from maka_temporal.workers.client.session_api import SessionClient
    from maka_temporal.workers.client.session_start import NewSession, SessionStart
    from maka_temporal.workers.host.plugin import MakaPlugin
    from maka_temporal.workflows.child import SessionResult
    from maka_temporal.workflows.contracts import TurnCancelled


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'maka_temporal' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
