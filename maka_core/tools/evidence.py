"""Finalize-only reconciliation of a file operation that has T1 but no T2.

The reconciler only *observes*: it opens the target read-only beneath the root (``beneath``: no
symlink on the way can redirect it outside, a final symlink is never followed, a FIFO never blocks),
compares what it finds with the evidence committed with T1, and reports one observation:

- ``matches_expected_state``: the file holds the expected-after bytes; the effect happened, so the
  call is finalized with the result the tool would have returned (no second write);
- ``matches_prior_state``: the file still holds the before bytes (or is still absent when it was
  absent); atomic rename is not compare-and-swap, so this alone does not authorize a redo: recovery
  redoes it only through the guarded replacement (``tools.redo``), else it parks;
- ``diverged``: some other content; never overwrite outside changes: park;
- ``unreadable``: missing, a symlink, not a regular file, over the size boundary, an I/O error,
  or evidence that does not belong to this call or workspace: park, do not guess.

The expected state is checked first: a write whose bytes equal the before bytes is complete.
The observation is digested as canonical JSON (``observationSchema: state_identity_v1``).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from maka_core.errors import MakaError
from maka_core.facts import canonical_json
from maka_core.facts.codec import canonical_args_hash, digest
from maka_core.facts.events import Observation
from maka_core.tools.base import FileEvidence, FileIdentity, Reconciliation, ToolRefusal, ToolResult
from maka_core.tools.beneath import locate, open_existing

if TYPE_CHECKING:
    from maka_core.workspace import Workspace

OBSERVATION_SCHEMA = "state_identity_v1"


def observe_file(ws: Workspace, evidence: FileEvidence) -> dict[str, Any]:
    """The target's current state as a JSON object: ``state`` plus identity when present.

    ``state`` is ``present`` (with ``sha256``/``size``), ``absent``, ``symlink``, ``not_regular``,
    ``too_large`` (with ``size``), ``outside_workspace`` or ``io_error``. Read-only.
    """
    base: dict[str, Any] = {
        "schema": OBSERVATION_SCHEMA,
        "workspaceIdentity": ws.identity,
        "target": evidence.target,
    }
    try:
        target = locate(str(ws.root), evidence.target)
    except MakaError:
        return {**base, "state": "outside_workspace"}
    with target:
        if target.rel != evidence.target:  # a symlink somewhere on the way now redirects the target
            return {**base, "state": "symlink"}
        try:
            fd, _ = open_existing(target)
        except FileNotFoundError:
            return {**base, "state": "absent"}
        except ToolRefusal as refusal:
            return {**base, "state": "symlink" if refusal.code == "path_changed" else "not_regular"}
        except OSError as exc:
            return {**base, "state": "io_error", "errno": errno.errorcode.get(exc.errno or 0, "EIO")}
    try:
        st = os.fstat(fd)
        if st.st_size > evidence.max_bytes:
            return {**base, "state": "too_large", "size": st.st_size}
        chunks: list[bytes] = []
        total = 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > evidence.max_bytes:
                return {**base, "state": "too_large", "size": total}
            chunks.append(chunk)
    except OSError as exc:
        return {**base, "state": "io_error", "errno": errno.errorcode.get(exc.errno or 0, "EIO")}
    finally:
        os.close(fd)
    ident = FileIdentity.of(b"".join(chunks))
    return {**base, "state": "present", "sha256": ident.sha256, "size": ident.size}


def classify(evidence: FileEvidence, observed: dict[str, Any]) -> Observation:
    """The observation for what ``observe_file`` saw, judged against the evidence."""
    state = observed["state"]
    if state == "present":
        current = FileIdentity(observed["sha256"], observed["size"])
        if current == evidence.expected_after:
            return "matches_expected_state"
        if current == evidence.before:
            return "matches_prior_state"
        return "diverged"
    if state == "absent" and evidence.before is None:
        return "matches_prior_state"
    # Anything else (including a file over the size boundary, which was not read) is not an
    # identity we can compare: unreadable, so recovery parks instead of guessing.
    return "unreadable"


def _finish(
    observation: Observation, observed: dict[str, Any], recovered: ToolResult | None
) -> Reconciliation:
    return Reconciliation(
        observation=observation,
        observation_digest=digest(canonical_json.dumps(observed)),
        recovered=recovered,
        observed=observed,
    )


def reconcile_file(
    tool_name: str,
    args: dict[str, Any],
    ws: Workspace,
    evidence: FileEvidence | None,
    result_for: Callable[[FileEvidence], ToolResult],
) -> Reconciliation:
    """Reconcile one file operation from its evidence; never writes.

    Args:
        tool_name: the tool whose call is being settled.
        args: the call's args (checked against the evidence's ``argsHash``).
        ws: the workspace as opened now.
        evidence: the evidence committed with T1 (None if none was stored).
        result_for: builds the tool's own success result from the evidence, so a recovered
            outcome is identical to what ``run`` returns.
    """
    if evidence is None:
        return _finish("unreadable", {"schema": OBSERVATION_SCHEMA, "state": "evidence_missing"}, None)
    mismatch = None
    if evidence.tool_name != tool_name:
        mismatch = "tool_name"
    elif evidence.args_hash != canonical_args_hash(tool_name, args):
        mismatch = "args_hash"
    elif evidence.workspace_identity != ws.identity:
        mismatch = "workspace_identity"
    if mismatch is not None:
        observed = {"schema": OBSERVATION_SCHEMA, "state": "evidence_mismatch", "field": mismatch}
        return _finish("unreadable", observed, None)
    observed = observe_file(ws, evidence)
    observation = classify(evidence, observed)
    recovered = result_for(evidence) if observation == "matches_expected_state" else None
    return _finish(observation, observed, recovered)
