"""Every park reason in plain words: what happened, and what an operator can do about it.

The console shows these beside the reason's code (the code stays the contract: the CLI, the JSON
and the docs name it). One entry per member of ``ParkReason`` (``runtime.contracts``), which holds
the resume's own reasons too; ``tests/test_console.py`` checks that none is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["PARK_WORDS", "park_words"]

_RESOLVE = "Check whether it happened, then resolve it (applied or not_applied) and resume."

PARK_WORDS: Mapping[str, str] = MappingProxyType(
    {
        "reconcile_matches_prior_state": "A call was cut off, and its target still looks as it did "
        "before the call: it probably did not happen, but nothing proves it. " + _RESOLVE,
        "reconcile_diverged": "A call was cut off, and its target now differs both from before the "
        "call and from what the call would have made: someone else changed it. " + _RESOLVE,
        "reconcile_unreadable": "A call was cut off, and its target could not be read to tell "
        "whether it happened. " + _RESOLVE,
        "dispatch_without_response": "A call that must run at most once was started and never "
        "answered (its worker died or timed out): it may or may not have happened, and running "
        "it again could do it twice. " + _RESOLVE,
        "legacy_dispatch_unknown": "A call was started by an older writer that did not record "
        "enough to tell what happened. " + _RESOLVE,
        "call_not_found": "The workflow names a call the ledger does not hold. Audit the session "
        "(maka audit) before anything else.",
        "workspace_unavailable": "The session's workspace folder could not be opened on the worker. "
        "Restore the folder (or its mount), then resume.",
        "workspace_identity_mismatch": "The folder at the session's path is not the session's "
        "workspace (another folder is there now). Put the right folder back, then resume.",
        "recovery_unavailable": "Recovery of a call could not run (its activity kept failing). "
        "Look at the worker's log, fix the cause, then resume.",
        "dispatch_attempts_exhausted": "A call kept failing before it started, so it never ran. "
        "Fix the cause (the worker's log says it), then resume.",
        "max_steps_exceeded": "The turn asked for more model steps than the session allows. Send a "
        "new message to go on, or raise the limit.",
        "usage_limit_reached": "The next model call would pass a token cap of the session's policy. "
        "Raise the cap (maka session raise-limit) to go on.",
        "ledger_corruption": "The ledger holds a contradiction for a call. Run maka ledger verify "
        "and maka audit; do not resolve it blind.",
        "recovery_parked": "An imported ledger parked a call for a reason this version does not "
        "write. " + _RESOLVE,
        "workspace_host_unavailable": "The session's workspace host did not pick its work up in "
        "time. Start a worker on that host, then resume (maka resume).",
        "tool_set_unavailable": "No worker that took the session's work serves its tool set. Start "
        "a worker that serves it, then resume.",
        "subagent_parked": "A sub-agent's child session parked. Open the child session, act on "
        "it there, then resume this one.",
        "resume_feature_disabled": "Resume is turned off for this session's worker. Turn it on, then resume.",
        "continuation_authority_unavailable": "The ledger could not be asked whether a "
        "continuation may start. Check the ledger's database, then resume.",
        "safety_observation_unavailable": "The workspace could not be checked before going on. "
        "Check the workspace and its host, then resume.",
        "resume_candidate_missing": "There is no run to continue from. Send a new message instead.",
        "source_run_unreadable": "The run to continue from cannot be read. Run maka ledger verify "
        "and maka audit.",
        "safety_check_failed": "The workspace changed since the session last saw it (or its "
        "checkpoint does not match), so going on would act on a folder the model never saw. "
        "Look at the change, put it back or accept it, then resume.",
        "continuation_already_exists": "A continuation of this run already started (another "
        "operator, or an earlier resume). Look at that run instead.",
        "continuation_repair_required": "A continuation was claimed and not finished. Resume "
        "again: repair settles it first.",
        "continuation_started_indeterminate": "A continuation may have started and nothing tells "
        "whether it did. Check Temporal for the execution, then resume.",
        "session_busy": "The session has a run still going. Wait for it or cancel it, then resume.",
        "ledger_chain_broken": "A row of the session no longer matches its chain digest (it was "
        "edited behind the writers): nothing acts on this session's facts. Run maka ledger "
        "verify and restore the ledger from a backup.",
    }
)


def park_words(reason: str | None) -> str | None:
    """``reason`` in plain words (None for no reason, or one this table does not know)."""
    return None if reason is None else PARK_WORDS.get(reason)
