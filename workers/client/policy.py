"""A session's governance, decided once for every caller (``maka session start|approve|deny``,
``SessionClient``, a worker's child session): the policy and principal a start records, the
pending approvals a status shows, and an answer committed through the ledger alone."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maka_core.errors import ConfigError, MakaError
from maka_core.governance import Identity, Principal, load_policy
from maka_core.runtime import approvals
from maka_core.runtime.governed import DEFAULT_SESSION_POLICY, SessionGovernance
from maka_core.settings import MakaSettings
from maka_temporal.workers.client.ledger import open_ledger

__all__ = [
    "SessionPolicy",
    "answer_approval",
    "check_session_known",
    "governance_status",
    "session_policy",
]


@dataclass(frozen=True)
class SessionPolicy:
    """A validated policy and principal for a session about to start."""

    session_id: str
    record: dict[str, Any]

    def record_in(self, s: MakaSettings) -> bool:
        """Record it in the ledger (once per session; the same again is a no-op). Returns whether
        this call recorded it (False: the session already had it).

        Raises:
            MakaError: ``session_policy_conflict`` when the session already has another.
        """
        with open_ledger(s.ledger, create=True) as store:
            return self.record_to(store)

    def record_to(self, store: Any) -> bool:
        """``record_in`` over an open ledger (a worker's: a child session's policy)."""
        recorded: bool = store.put_session_policy(
            self.session_id,
            policy=self.record["policy"],
            version=self.record["version"],
            digest=self.record["digest"],
            identity=self.record["identity"],
        )
        return recorded

    def forget_in(self, s: MakaSettings) -> None:
        """Take back what ``record_in`` recorded, for a start the server refused before any workflow
        existed (``LedgerStore.forget_session_policy``: never for a session that ran)."""
        with open_ledger(s.ledger, create=True) as store:
            store.forget_session_policy(self.session_id, self.record["digest"])


def session_policy(
    s: MakaSettings,
    session_id: str | None,
    policy_file: Path | None,
    principal: str | None,
    on_behalf_of: tuple[str, ...],
    unhinged: bool = False,
) -> SessionPolicy:
    """Validate the session's policy and principal (nothing is written here).

    A policy's ``unhinged: true`` is one key of MELRA's two: it is honoured only when the operator
    turns the second (``--unhinged``) for this session, and refused otherwise.

    Raises:
        ConfigError: ``policy_invalid`` (with ``field``), ``unhinged_not_confirmed`` or
            ``principal_invalid``.
    """
    path = policy_file
    if path is None and s.home is not None and (Path(s.home) / "policy.json").is_file():
        path = Path(s.home) / "policy.json"
    policy = DEFAULT_SESSION_POLICY if path is None else load_policy(path)
    if policy.unhinged and not unhinged:
        raise ConfigError(
            "unhinged_not_confirmed",
            f"{path} sets unhinged: true (no guardrails); pass --unhinged to honour it",
            path=str(path),
            field="unhinged",
        )
    if len(on_behalf_of) > 7:
        raise ConfigError("principal_invalid", "at most 7 --on-behalf-of principals")
    identity = Identity(
        principal=Principal.parse(principal or "agent:local"),
        on_behalf_of=tuple(Principal.parse(p) for p in on_behalf_of),
    )
    sid = session_id or f"sess-{uuid.uuid4()}"
    return SessionPolicy(sid, SessionGovernance(policy, identity).to_record())


def governance_status(store: Any, session_id: str, state: str) -> dict[str, Any]:
    """What ``maka session status --json`` adds: the requests of running turns still awaiting an
    answer (a request left behind by a turn that ended otherwise waits for nobody), and the state
    ``awaiting_approval`` while any does."""
    pending = []
    for item in approvals.pending(store, session_id):
        header = store.get_run(item.pop("runId"))
        if header is not None and header.status == "running":
            pending.append(item)
    waiting = bool(pending) and state == "running"
    return {"pendingApprovals": pending, **({"state": "awaiting_approval"} if waiting else {})}


def check_session_known(ledger: Any, session_id: str) -> None:
    """Every session start records its policy in the ledger before its workflow exists, so a
    session the ledger has never heard of is one Temporal does not know either: say so, as every
    other session command does, rather than blame the approval id.

    Raises:
        MakaError: ``session_not_found``.
    """
    with open_ledger(ledger, create=False) as store:
        if store.session_policy(session_id) is None and not store.events(session_id=session_id):
            raise MakaError("session_not_found", f"no session {session_id}", sessionId=session_id)


def answer_approval(
    ledger: Any,
    session_id: str,
    approval_id: str,
    *,
    allow: bool,
    phrase: str | None = None,
    by: str | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """Approve or deny through the ledger alone (the execution is not running); returns what was
    committed (``runtime.approvals.answer`` and its codes). The caller (``SessionClient``) has
    checked the session exists (``check_session_known``)."""
    with open_ledger(ledger, create=False) as store:
        done: dict[str, Any] = approvals.answer(
            store, session_id, approval_id, allow=allow, phrase=phrase, by=by, reason=reason
        )
    return done
