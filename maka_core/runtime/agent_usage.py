"""The tokens a session's sub-agents spent: what its token caps count beside its own steps (issue
31 item 3).

A parent's caps cover its children. The cap check before each of the parent's provider calls
(``model_step.check_usage``) counts, beside the session's own committed usage, every model step of
the child sessions its ``agent__`` calls started, and of theirs, down the tree (a child's id is
derived from its call, ``tools.subagent.child_session_id``, so the parent's T1 facts name them):

- ``maxTokensPerTurn``: the children of the turn's own calls;
- ``maxTokensPerSession``: every child the session started.

A child is not stopped mid-turn by its parent's cap (its own caps, if its policy sets any, hold as
for any session): what it spent counts at the parent's next step, which is refused before its call
(``usage_limit_reached``, naming the parent's cap) as a lone session's is when its own last step
passed the cap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

from maka_core.facts.events import RuntimeEvent
from maka_core.facts.usage import step_tokens
from maka_core.tools.subagent import child_session_id, is_subagent

__all__ = ["NO_SUB_AGENTS", "SubAgentUsage", "sub_agent_usage"]

#: How deep the read follows sub-agents of sub-agents: past ``maxAgentDepth`` (2), a bound that a
#: ledger edited behind the writers cannot turn into an endless read.
MAX_TREE_DEPTH = 8


class SubAgentUsage(NamedTuple):
    """Tokens the sub-agent sessions spent: those of the turn's calls, and of all the session's."""

    turn: int
    session: int


#: A session without sub-agents (or one whose caps need not read them).
NO_SUB_AGENTS: Final = SubAgentUsage(0, 0)


def sub_agent_usage(
    read: Callable[[str], Sequence[RuntimeEvent]], events: Sequence[RuntimeEvent], run_id: str
) -> SubAgentUsage:
    """What the child sessions started by ``events``' sub-agent calls spent (their own children
    included); ``turn``: those started by the calls of run ``run_id``. ``read``: a session's events."""
    return _below(read, events, run_id, 0)


def _below(
    read: Callable[[str], Sequence[RuntimeEvent]], events: Sequence[RuntimeEvent], run_id: str, depth: int
) -> SubAgentUsage:
    turn = session = 0
    if depth >= MAX_TREE_DEPTH:
        return SubAgentUsage(0, 0)
    for event in events:
        dispatch = event.actions.tool_dispatch if event.actions is not None else None
        if dispatch is None or not is_subagent(dispatch.tool_name):
            continue
        child = read(child_session_id(event.session_id, dispatch.operation_id))
        spent = _own(child) + _below(read, child, "", depth + 1).session
        session += spent
        if event.run_id == run_id:
            turn += spent
    return SubAgentUsage(turn, session)


def _own(events: Sequence[RuntimeEvent]) -> int:
    total = 0
    for event in events:
        usage = event.actions.token_usage if event.actions is not None else None
        if usage:
            total += step_tokens(usage)
    return total
