"""Evidence predicates, their evaluation, and the task statuses they decide (after MELRA).

Success means the declared predicates hold, not that the tool said so: a tool that succeeded
while a predicate failed is ``partial``, and only ``verified_success`` counts as success. A
mutation that declares no predicates gets the obvious post-condition derived from the call
(MELRA's ``defaultEvidenceFor``) or the policy's ``defaultEvidence`` for that tool; where none
is derivable (a command line) the list stays empty and policy denies the mutation.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints

from maka_core.errors import MakaError
from maka_core.governance.classify import Classification, GovernanceModel

TaskStatus = Literal[
    "planned", "awaiting_approval", "running", "verifying", "verified_success", "partial", "failed",
    "cancelled", "waiting_user", "policy_blocked", "budget_exhausted", "recovery_required",
]  # fmt: skip
CertificateResult = Literal[
    "VERIFIED_SUCCESS", "PARTIAL", "FAILED", "CANCELLED", "WAITING_APPROVAL", "WAITING_USER",
    "POLICY_BLOCKED", "BUDGET_EXHAUSTED",
]  # fmt: skip
EvidenceStrength = Literal["execution", "state", "independent", "semantic"]

_Path = Annotated[str, StringConstraints(min_length=1, max_length=4096)]
_ResultPath = Annotated[str, StringConstraints(min_length=1, max_length=512)]


class ResultEquals(GovernanceModel):
    type: Literal["result_equals"]
    path: _ResultPath
    value: str | int | float | bool | None


class ResultContains(GovernanceModel):
    type: Literal["result_contains"]
    path: _ResultPath
    value: Annotated[str, StringConstraints(max_length=10_000)]


class FileExists(GovernanceModel):
    type: Literal["file_exists"]
    path: _Path


class FileAbsent(GovernanceModel):
    type: Literal["file_absent"]
    path: _Path


class FileHash(GovernanceModel):
    type: Literal["file_hash"]
    path: _Path
    sha256: Annotated[str, StringConstraints(pattern=r"^[a-f0-9]{64}$")]


class ExitCode(GovernanceModel):
    type: Literal["exit_code"]
    value: int


class ToolSucceeded(GovernanceModel):
    """The tool reported no error: the default evidence of a contract tool's mutation (its
    declared guarantee governs the rest; ``maka_core.tools.contract``)."""

    type: Literal["tool_succeeded"]


EvidencePredicate = Annotated[
    ResultEquals | ResultContains | FileExists | FileAbsent | FileHash | ExitCode | ToolSucceeded,
    Field(discriminator="type"),
]

#: The predicates that re-read the world instead of the tool's own report (MELRA's ``state``
#: strength); an interrupted mutation may be verified after a restart only from these.
STATE_PREDICATES: frozenset[str] = frozenset({"file_exists", "file_absent", "file_hash"})


def evidence_strength(predicate_type: str) -> EvidenceStrength:
    """How an item is known; an unrecognised type reads as the weakest claim."""
    return "state" if predicate_type in STATE_PREDICATES else "execution"


class EvidenceItem(GovernanceModel):
    """One evaluated predicate as a receipt records it."""

    type: str
    passed: bool
    summary: str
    strength: EvidenceStrength
    source: str | None = None
    digest: str | None = None


@dataclass(frozen=True)
class ProbedFile:
    """What a probe saw at a workspace path: present or not, and the sha256 hex when a file."""

    exists: bool
    sha256: str | None = None


#: Reads a workspace path without writing; raises ``MakaError`` (its code becomes the summary)
#: for a path outside the workspace or one it cannot read.
FileProbe = Callable[[str], ProbedFile]


@dataclass(frozen=True)
class ToolObservation:
    """What the tool reported: its JSON result value and, for a command, its exit code."""

    result: Any
    exit_code: int | None = None
    is_error: bool = False


_MISSING = object()
_INDEX = re.compile(r"0|[1-9][0-9]*")


def result_at(value: Any, path: str) -> Any:
    """The value at a dotted ``path`` (list items by index); a private sentinel when absent."""
    current = value
    for part in path.split("."):
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and _INDEX.fullmatch(part) and int(part) < len(current):
            current = current[int(part)]
        else:
            return _MISSING
    return current


def _same_json(a: Any, b: Any) -> bool:
    # JSON equality: true is not 1, 1 equals 1.0, and containers never equal a scalar predicate.
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    return a is None and b is None


def evaluate_predicate(
    predicate: EvidencePredicate, observation: ToolObservation, probe: FileProbe | None
) -> EvidenceItem:
    """Evaluate one predicate; never raises for an unobservable fact (the item fails instead)."""
    kind = predicate.type

    def item(passed: bool, summary: str, source: str | None = None) -> EvidenceItem:
        return EvidenceItem(
            type=kind, passed=passed, summary=summary, strength=evidence_strength(kind), source=source
        )

    if isinstance(predicate, (ResultEquals, ResultContains)):
        found = result_at(observation.result, predicate.path)
        if found is _MISSING:
            return item(False, f"result has no {predicate.path}", "result")
        if isinstance(predicate, ResultEquals):
            ok = _same_json(found, predicate.value)
            return item(
                ok, f"{predicate.path} {'equals' if ok else 'does not equal'} the expected value", "result"
            )
        ok = isinstance(found, str) and predicate.value in found
        return item(
            ok, f"{predicate.path} {'contains' if ok else 'does not contain'} the expected text", "result"
        )
    if isinstance(predicate, ToolSucceeded):
        ok = not observation.is_error
        return item(ok, "the tool reported success" if ok else "the tool reported an error", "result")
    if isinstance(predicate, ExitCode):
        ok = observation.exit_code == predicate.value
        return item(ok, f"exit code {observation.exit_code}, expected {predicate.value}", "result")
    if probe is None:
        return item(False, "verification_probe_unavailable", predicate.path)
    try:
        seen = probe(predicate.path)
    except MakaError as exc:
        return item(False, exc.code, predicate.path)
    if isinstance(predicate, FileExists):
        return item(seen.exists, "file exists" if seen.exists else "file is absent", predicate.path)
    if isinstance(predicate, FileAbsent):
        return item(not seen.exists, "file is absent" if not seen.exists else "file exists", predicate.path)
    ok = seen.exists and seen.sha256 == predicate.sha256
    return item(ok, "sha256 matches" if ok else "sha256 differs or file is absent", predicate.path)


def evaluate(
    predicates: Sequence[EvidencePredicate], observation: ToolObservation, probe: FileProbe | None = None
) -> tuple[EvidenceItem, ...]:
    """Evaluate every predicate in order (all of them: a receipt shows each failure)."""
    return tuple(evaluate_predicate(p, observation, probe) for p in predicates)


def verification_status(tool_succeeded: bool, items: Sequence[EvidenceItem]) -> TaskStatus:
    """``failed`` when the tool failed; ``partial`` when it succeeded but a predicate did not hold."""
    if not tool_succeeded:
        return "failed"
    return "verified_success" if all(i.passed for i in items) else "partial"


def is_success(status: TaskStatus) -> bool:
    """Only ``verified_success`` counts as success."""
    return status == "verified_success"


_CERTIFICATE_RESULT: dict[TaskStatus, CertificateResult] = {
    "verified_success": "VERIFIED_SUCCESS",
    "partial": "PARTIAL",
    "failed": "FAILED",
    "cancelled": "CANCELLED",
    "awaiting_approval": "WAITING_APPROVAL",
    "waiting_user": "WAITING_USER",
    "policy_blocked": "POLICY_BLOCKED",
    "budget_exhausted": "BUDGET_EXHAUSTED",
}


def certificate_result(status: TaskStatus) -> CertificateResult:
    """The certificate's result for a task that stopped in ``status``.

    Raises:
        ValueError: the task has not settled (planned, running, verifying) or is parked for
            recovery, where any result would be a guess.
    """
    result = _CERTIFICATE_RESULT.get(status)
    if result is None:
        raise ValueError(f"a task in {status} has no certificate result")
    return result


# --- default evidence ----------------------------------------------------------------------

_TEMPLATE = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}")


def _fill(text: str, args: Mapping[str, Any]) -> str:
    def one(match: re.Match[str]) -> str:
        value = args.get(match.group(1))
        if not isinstance(value, str):
            raise MakaError("evidence_template_unresolved", f"no string argument {match.group(1)!r}")
        return value

    return _TEMPLATE.sub(one, text)


def fill_templates(predicate: EvidencePredicate, args: Mapping[str, Any]) -> EvidencePredicate:
    """A policy's default predicate with ``{{arg}}`` tokens replaced by the call's string args.

    Raises:
        MakaError: ``evidence_template_unresolved`` when an argument is missing or not a string.
    """
    data = predicate.model_dump(by_alias=True)
    filled = {k: _fill(v, args) if isinstance(v, str) and k != "type" else v for k, v in data.items()}
    return type(predicate).model_validate(filled)


def default_evidence_for(
    classification: Classification,
    args: Mapping[str, Any],
    policy_defaults: Mapping[str, Sequence[EvidencePredicate]] | None = None,
    derived: Sequence[EvidencePredicate] = (),
) -> tuple[EvidencePredicate, ...]:
    """Evidence for a mutation that declared none: the policy's, else MELRA's derived default:
    ``derived``, what the tool declares for its mutation (``{{arg}}`` templates; the file tools:
    ``file_exists``), or, for a MELRA task operation, what its operation implies.

    Reads get none: a synthesized predicate could only turn a successful read into ``partial``.
    The policy's entry is keyed by tool name (``write_file``) or operation name (``file.write``).
    """
    if classification.is_read:
        return ()
    configured = (policy_defaults or {}).get(classification.name)
    if configured is not None:
        return tuple(fill_templates(p, args) for p in configured)
    if derived:
        return tuple(fill_templates(p, args) for p in derived)
    path = args.get("path")
    name = classification.name
    if name in ("file.write", "file.mkdir") and isinstance(path, str):
        return (FileExists(type="file_exists", path=path),)
    if name == "file.delete" and isinstance(path, str):
        return (FileAbsent(type="file_absent", path=path),)
    destination = args.get("destination")
    if name == "file.move" and isinstance(path, str) and isinstance(destination, str):
        return (FileAbsent(type="file_absent", path=path), FileExists(type="file_exists", path=destination))
    if name == "terminal.send":
        return (ResultEquals(type="result_equals", path="sent", value=True),)
    return ()  # a command line says nothing about what it should leave behind
