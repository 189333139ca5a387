"""A spent token cap, raised by an operator: the way forward of a ``usage_limit_reached`` park.

A session's policy (its ``usage`` caps included) is fixed at ``session start``, sealed by its digest
into every receipt, so a cap is never edited in place. An operator who decides the session may spend
more records a **limit raise** instead: its own fact in its own operator run, like an operator's
resolution (``resolution-<uuid>``, one terminal system event, ``stateDelta.usageLimitRaise``), with
who raised it, why, the cap it replaces and what the session had spent. The model step's cap check
(``model_step.check_usage``) applies every raise of the session, in ledger order, over the
policy's caps (``limits_in_force``); ``session status --json`` gives the caps in force and the
raises, ``session show`` prints each, and ``maka audit`` counts the run as an operator's.

A raise only raises: above the cap in force (and a session cap above the session's total spent;
a turn cap is not compared with a turn's spend, since the continuation that goes on is a turn of
its own), and only a cap the policy sets (a policy without one has no cap to raise).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from maka_core.errors import ConfigError, LimitRaiseRefused, MakaError
from maka_core.facts.bounds import OPERATOR_NAME, OPERATOR_REASON
from maka_core.facts.clock import now_ms
from maka_core.facts.events import RuntimeEvent
from maka_core.facts.usage import step_tokens
from maka_core.governance.policy_file import UsageLimits
from maka_core.runtime.compaction import CompactionFact, estimate_tokens
from maka_core.runtime.governed import SessionGovernance
from maka_core.runtime.resolution import (
    check_resolution_text,
    is_resolution_run,
    operator_fact,
)

RAISE_KEY: Final[str] = "usageLimitRaise"
RAISE_PROTOCOL: Final[str] = "maka.usage_limit_raise.v1"
#: The caps a raise may name: the policy's field (camelCase, as in the policy file) -> its attribute.
CAPS: Final[dict[str, str]] = {
    "maxTokensPerTurn": "max_tokens_per_turn",
    "maxTokensPerSession": "max_tokens_per_session",
}


def raise_payload(event: RuntimeEvent) -> dict[str, Any] | None:
    """The raise an operator run's event records, else None."""
    if not is_resolution_run(event.run_id):
        return None
    delta = event.actions.state_delta if event.actions is not None else None
    payload = delta.get(RAISE_KEY) if isinstance(delta, Mapping) else None
    if isinstance(payload, Mapping) and payload.get("protocol") == RAISE_PROTOCOL:
        return dict(payload)
    return None


def raises_of(events: Sequence[RuntimeEvent]) -> list[dict[str, Any]]:
    """Every limit raise of these events (a session's, ledger order)."""
    return [p for p in map(raise_payload, events) if p is not None]


def limits_in_force(limits: UsageLimits | None, events: Sequence[RuntimeEvent]) -> UsageLimits | None:
    """The policy's caps with the session's raises applied in ledger order. A raise only raises: a
    cap in force never goes down (two operators who raced, each checked against what they read,
    leave the higher); a raise of a cap the policy does not set is ignored: there was none to raise."""
    if limits is None:
        return None
    caps = {attr: getattr(limits, attr) for attr in CAPS.values()}
    for payload in raises_of(events):
        raised = payload.get("caps")
        for field, attr in CAPS.items():
            value = raised.get(field) if isinstance(raised, Mapping) else None
            if (
                caps[attr] is not None
                and isinstance(value, int)
                and not isinstance(value, bool)
                and value > caps[attr]
            ):
                caps[attr] = value
    return limits.model_copy(update=caps)


def next_call_tokens(events: Sequence[RuntimeEvent], sent: Sequence[RuntimeEvent] | None = None) -> int:
    """The next call's estimate: the session's last model step's tokens (a compaction's are a
    summary's, not what a step's call sends), and at least ``sent``'s estimate when given."""
    last = 0
    for e in events:
        usage = e.actions.token_usage if e.actions is not None else None
        if usage and CompactionFact.of(e) is None:
            last = step_tokens(usage)
    return last if sent is None else max(last, estimate_tokens(sent))


def spent(events: Sequence[RuntimeEvent]) -> dict[str, int]:
    """What each cap counts, from committed usage: the session's total and its latest turn's (the
    latest run that is not an operator's)."""
    session = 0
    by_run: dict[str, int] = {}
    latest: str | None = None
    for e in events:
        if is_resolution_run(e.run_id):
            continue
        latest = e.run_id
        usage = e.actions.token_usage if e.actions is not None else None
        if usage:
            n = step_tokens(usage)
            session += n
            by_run[e.run_id] = by_run.get(e.run_id, 0) + n
    return {"maxTokensPerTurn": by_run.get(latest or "", 0), "maxTokensPerSession": session}


def _cap(value: Any, option: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError("config_invalid", f"{option} must be a whole number of tokens >= 1", option=option)
    return value


def raise_limit(
    store: Any,
    session_id: str,
    *,
    caps: Mapping[str, int],
    raised_by: str,
    reason: str,
) -> dict[str, Any]:
    """Record an operator's raise of the session's token caps (``caps``: policy field -> the new
    cap); returns the recorded payload with its run and event ids.

    Raises:
        MakaError: ``session_not_found`` (no event and no policy); ``config_invalid`` (no cap named,
            an unknown field, a cap that is not a whole number >= 1, a ``--by``/``--reason`` that is
            empty, too long or not one printable line); ``usage_limit_not_raised`` (the policy sets
            no such cap, or the new one is not above the cap in force); ``usage_limit_below_used``
            (a session cap that does not exceed what the session already spent; a turn cap is not
            compared with a turn's spend: the continuation is a turn of its own, a fresh budget).

    The answer adds ``nextCall``: the next call's estimate (``next_call_tokens``), for the operator
    to see whether the new caps admit it (not recorded: the check recomputes it).
    """
    if not caps:
        raise ConfigError(
            "config_invalid", "name a cap to raise (--max-tokens-per-session or --max-tokens-per-turn)"
        )
    for field, value in caps.items():
        if field not in CAPS:
            raise ConfigError("config_invalid", f"no token cap {field}", field=field)
        _cap(value, field)
    check_resolution_text(raised_by, "--by", OPERATOR_NAME)
    check_resolution_text(reason, "--reason", OPERATOR_REASON)
    events = store.events(session_id=session_id)
    record = store.session_policy(session_id)
    if not events and record is None:
        raise MakaError("session_not_found", f"no session {session_id}", sessionId=session_id)
    policy = SessionGovernance.from_record(record).policy.usage
    in_force = limits_in_force(policy, events)
    used = spent(events)
    previous: dict[str, int] = {}
    for field, value in caps.items():
        current = getattr(in_force, CAPS[field]) if in_force is not None else None
        if current is None:
            raise LimitRaiseRefused(
                "usage_limit_not_raised",
                f"session {session_id}'s policy sets no usage.{field}: there is no cap to raise",
                sessionId=session_id, limit=f"usage.{field}",
            )  # fmt: skip
        if field == "maxTokensPerSession" and value <= used[field]:
            raise LimitRaiseRefused(
                "usage_limit_below_used",
                f"usage.{field} of {value} would not exceed the {used[field]} tokens already spent",
                sessionId=session_id, limit=f"usage.{field}", cap=value, used=used[field],
            )  # fmt: skip
        if value <= current:
            raise LimitRaiseRefused(
                "usage_limit_not_raised",
                f"usage.{field} of {value} is not above the cap in force, {current}",
                sessionId=session_id, limit=f"usage.{field}", cap=value, current=current,
            )  # fmt: skip
        previous[field] = current
    now = now_ms()
    payload = {
        "protocol": RAISE_PROTOCOL,
        "version": 1,
        "sessionId": session_id,
        "caps": dict(caps),
        "previous": previous,
        "used": {field: used[field] for field in caps},
        "raisedBy": raised_by,
        "reason": reason,
        "raisedAt": now,
    }
    event, header = operator_fact(
        session_id, name="usage_limit_raise", key=RAISE_KEY, payload=payload, now=now, hidden=True
    )
    store.commit_terminal(event, header)
    raised = {"raiseEventId": event.id, "raiseRunId": event.run_id, "nextCall": next_call_tokens(events)}
    return {**payload, **raised}
