"""A guarded redo: a file write interrupted before its effect, done once by recovery.

The reconciler found the target still holding the recorded before-state (``matches_prior_state``).
An atomic rename would replace whatever is there by now, so that alone never authorized a redo;
``guarded_replace`` does: the new content replaces the target only if the target is still exactly
the before-state at the moment of the exchange, else the names are swapped back.

Exactly once across crashes comes from the ledger, not the file: recovery records the redo (a
``recovery`` attempt row, ``Ledger.record_rerun``) before it starts, and only the call that
recorded the first one (run 2; T1 is run 1) may exchange. Any later run only settles what an
interrupted one left (``settle_leftover``: the side file is checked, kept or undone) and then
observes: the target holding the new content is the redo's effect (settled as applied, from
evidence); anything else parks. So a target an outside writer set back to the before bytes after
a redo is never written a second time. Settle and observation hold the folder's lock
(``guarded_replace.folder_lock``), as the exchange does: a recovery beside a live redo (its lock
held, or its side file there while it runs) parks ``redo_already_started`` (observed as
``unreadable``) with nothing touched, never judging a half-done exchange.

What was observed and what the exchange did are the observation (``observed["redo"]``, covered by
its digest) and the receipt; the bundle's observation is ``matches_expected_state`` only when the
exchange (or its repair) put the new content in place, or the target holds it now.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from maka_core.facts import canonical_json
from maka_core.facts.codec import digest
from maka_core.tools.base import FileEvidence, FileIdentity, Reconciliation, ToolRefusal, ToolResult
from maka_core.tools.effect_journal import record as record_effect
from maka_core.tools.evidence import classify, observe_file
from maka_core.tools.guarded_replace import GuardedReplace, guarded_replace, settle_leftover

if TYPE_CHECKING:
    from maka_core.workspace import Workspace

#: The run number of the one redo that may exchange (T1's run is 1).
FIRST_REDO: Final = 2

Replace = Callable[[str, str, FileIdentity | None, bytes, int], GuardedReplace]
Settle = Callable[
    [str, str, FileIdentity | None, FileIdentity, Callable[[], dict[str, Any]], int, bool],
    tuple[GuardedReplace | None, dict[str, Any] | None],
]


def guarded(root: str, rel: str, before: FileIdentity | None, data: bytes, max_bytes: int) -> GuardedReplace:
    """The replacement a redo uses: ``guarded_replace``, making the folders a write into a new
    folder would have made (the original ``write_file`` creates them too)."""
    return guarded_replace(root, rel, before, data, max_bytes=max_bytes, create_parents=before is None)


def settled(
    root: str,
    rel: str,
    before: FileIdentity | None,
    after: FileIdentity,
    observe: Callable[[], dict[str, Any]],
    max_bytes: int,
    peer_live: bool,
) -> tuple[GuardedReplace | None, dict[str, Any] | None]:
    """How a later run settles a redo's leftover and observes: ``settle_leftover``."""
    return settle_leftover(root, rel, before, after, observe, max_bytes=max_bytes, peer_live=peer_live)


def redo_write(
    tool_name: str,
    ws: Workspace,
    evidence: FileEvidence,
    prior: Reconciliation,
    *,
    run: int | None,
    content: Callable[[], bytes],
    result_for: Callable[[FileEvidence], ToolResult],
    replace: Replace = guarded,
    settle: Settle = settled,
) -> Reconciliation:
    """Redo (run ``FIRST_REDO``) or settle (a later run) one write; what recovery commits.

    Args:
        prior: the reconciliation that found the before-state.
        run: the number ``record_rerun`` gave this redo; None: a redo was recorded before this
            recovery, so only what it left is settled.
        content: the write's new bytes, planned again (raises ``ToolRefusal`` when it no longer
            applies); checked against the evidence's expected-after identity.
        replace: the conditional replacement (the default is the guarded one).
        settle: how a later run settles and observes (the default is ``settle_leftover``).
    """
    root, rel = str(ws.root), evidence.target
    note: dict[str, Any] = {"run": run, "priorObservationDigest": prior.observation_digest}
    result: GuardedReplace | None = None
    observed: dict[str, Any] | None = None
    try:
        if run != FIRST_REDO:
            # A redo was recorded before this one (None: before this recovery; a number past the
            # first: a recovery racing this one recorded it first, and is alive): it may have
            # exchanged. Settle what it left and never exchange again.
            note["code"] = "redo_already_started"
            result, observed = settle(
                root,
                rel,
                evidence.before,
                evidence.expected_after,
                lambda: observe_file(ws, evidence),
                evidence.max_bytes,
                run is not None,
            )
            if observed is None:  # a live peer's redo is in progress: nothing was looked at
                observed = {"state": "redo_in_progress"}
        else:
            data = _content(content, evidence)
            result = replace(root, rel, evidence.before, data, evidence.max_bytes)
            if result.done:
                record_effect(tool_name, ws.root / rel, data)  # drills only (MAKA_EFFECT_LOG)
    except ToolRefusal as refusal:
        note["code"] = refusal.code
    except OSError as exc:
        note["code"] = "redo_io_failed"
        note["detail"] = exc.strerror or str(exc)
    if result is not None:
        note.update(outcome=result.outcome, code=result.code or note.get("code"), detail=result.detail)
    note = {k: v for k, v in note.items() if v is not None and v != ""}
    if observed is None:
        observed = observe_file(ws, evidence)
    observation = classify(evidence, observed)
    if result is not None and result.code == "redo_already_started":
        observation = "unreadable"  # a half-done exchange of a live peer is no evidence either way
    if result is not None and result.done:
        # The exchange's own check saw the before-state and put the new content in place; a write
        # after it is a later write, not a doubt about this one.
        observation = "matches_expected_state"
    full = {**observed, "redo": note}
    return Reconciliation(
        observation=observation,
        observation_digest=digest(canonical_json.dumps(full)),
        recovered=result_for(evidence) if observation == "matches_expected_state" else None,
        observed=full,
    )


def held_by_attempt(evidence: FileEvidence) -> Reconciliation:
    """What recovery observes of a target whose folder an attempt still holds locked past the
    wait (a worker frozen in the middle of its write): nothing it can judge (``unreadable``), so
    the call parks; the frozen attempt, fenced, writes nothing if it has not begun to."""
    observed = {"state": "held_by_attempt", "path": evidence.target}
    return Reconciliation(
        observation="unreadable",
        observation_digest=digest(canonical_json.dumps(observed)),
        recovered=None,
        observed=observed,
    )


def _content(content: Callable[[], bytes], evidence: FileEvidence) -> bytes:
    data = content()
    if FileIdentity.of(data) != evidence.expected_after:
        raise ToolRefusal(
            "redo_content_changed", "the write planned again differs from its evidence", path=evidence.target
        )
    return data
