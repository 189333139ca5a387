"""A session's own settings as the ledger carries them: the record on each run's user event
(``stateDelta.makaSession``): workspace, its identity, the queue and the ``SessionConfig``, so the
ledger alone can carry a session whose Temporal history is gone (``lost_run``), and the session
index can show its host (``store.session_index``, which must not import the runtime above this).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from maka_core.facts.events import RuntimeEvent
from maka_core.runtime.contracts import SessionConfig

__all__ = ["SESSION_KEY", "SessionRecord", "record_of", "session_record"]

#: ``stateDelta`` key of the session record on a run's user event.
SESSION_KEY: Final[str] = "makaSession"


@dataclass(frozen=True)
class SessionRecord:
    """What a new execution of a session needs, as the ledger recorded it: where the session works,
    the queue its workflow ran on, and its settings (``SessionConfig``), so a new execution (``maka
    resume``, ``session send`` over a closed one) runs with the settings it was started with.

    Stored as one flat camelCase object: ``workspace``, ``workspaceIdentity``, ``taskQueue`` and
    the config's keys (``provider``, ``host``, ``hostWait``, ``modelStepMode``...). Records written
    before the config held more than the provider and the host decode with the defaults of the
    rest (those sessions ran with the defaults), and an older reader finds the keys it knows."""

    workspace: str
    workspace_identity: str
    config: SessionConfig
    task_queue: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "workspace": self.workspace,
            "workspaceIdentity": self.workspace_identity,
            **self.config.to_json(),
        }
        if self.task_queue:
            out["taskQueue"] = self.task_queue
        return out

    @classmethod
    def from_json(cls, raw: Any) -> SessionRecord | None:
        if not isinstance(raw, Mapping):
            return None
        ws, ident, queue = raw.get("workspace"), raw.get("workspaceIdentity"), raw.get("taskQueue")
        if not isinstance(ws, str) or not isinstance(ident, str):
            return None
        # An empty host was never a pin (the record left it out): read it as none, as before.
        config = SessionConfig.from_json({k: v for k, v in raw.items() if not (k == "host" and not v)})
        if config is None:
            return None
        return cls(ws, ident, config, queue if isinstance(queue, str) and queue else None)


def record_of(event: RuntimeEvent) -> SessionRecord | None:
    """The valid session record this event carries, if any."""
    delta = event.actions.state_delta if event.actions is not None else None
    if isinstance(delta, Mapping) and SESSION_KEY in delta:
        return SessionRecord.from_json(delta[SESSION_KEY])
    return None


def session_record(events: list[RuntimeEvent]) -> SessionRecord | None:
    """The latest session record among these events (a session's events, ledger order)."""
    for event in reversed(events):
        record = record_of(event)
        if record is not None:
            return record
    return None
