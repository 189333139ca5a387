"""The Phase 4 checkpoint contract: a workspace boundary, its one canonical bundle, the provider.

A ``WorkspaceBoundary`` binds a Runtime boundary (the immutable high-water and prefix digest a
run ended on) to the workspace it ran in: its logical identity, the epoch (incremented by each
durable rebaseline), and a checkpoint of the workspace's contents with the hash of the policy
that decided how it was captured. It is written as one ``CheckpointBundle``, canonical JSON
with a stable schema id, so the bundle's digest names exactly one boundary and the fact that
commits it is atomic with the boundary it binds.

A workspace that cannot be captured (no Git, an ineligible repository) still gets a bundle: it
carries a ``NoCheckpoint`` with a stable code instead of a ``Checkpoint``, and the boundary has
no ``checkpointRef``; the host keeps today's behaviour and cannot claim a snapshot.

A ``CheckpointProvider`` captures, verifies, compares and materializes; each answer is an
observation (``Checkpoint``, ``NoCheckpoint``, ``Verification``, ``WorkspaceDiff``, a path).
None of them is a decision: whether a session may resume is the planner's, from facts, never a
provider's (the seed: "A checkpoint provider may capture, verify, and materialize. It may not
approve resume.").
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, Protocol, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from maka_core.errors import CheckpointError, CodecError
from maka_core.facts import canonical_json
from maka_core.facts.codec import digest
from maka_core.facts.events import NonEmpty, RuntimeEvent, Sha256Digest

if TYPE_CHECKING:
    from maka_core.workspace import Workspace

CHECKPOINT_BUNDLE_SCHEMA: Final = "maka.workspace_checkpoint/v1"
CHECKPOINT_POLICY_SCHEMA: Final = "maka.checkpoint_policy/v1"

Carrier = Literal["git"]
#: Why a workspace has no checkpoint. Closed: a host branches on these.
NoCheckpointCode = Literal[
    "git_unavailable",  # no git binary
    "workspace_not_git",  # the workspace is not inside a Git work tree
    "repository_bare",  # a bare repository, or the workspace is inside a git directory
    "repository_operation_in_progress",  # merge, rebase, cherry-pick or revert, or unmerged entries
    "repository_has_submodules",  # a gitlink or a nested repository a capture cannot hold
    "workspace_too_large",  # over the policy's file count or byte size
    "repository_unreadable",  # git refused the repository (ownership, corruption)
    "checkpoint_host_elsewhere",  # the run ended on a worker that is not the session's workspace host
    "checkpoint_capture_failed",  # the capture failed (git killed, the store unwritable or misplaced)
    "checkpoint_budget_exceeded",  # the capture did not finish within its time budget
]
NO_CHECKPOINT_CODES: Final[frozenset[str]] = frozenset(get_args(NoCheckpointCode))
#: The codes the host records about a capture (not a property of the workspace a carrier reports).
HOST_NO_CHECKPOINT_CODES: Final[frozenset[str]] = frozenset(
    {"checkpoint_host_elsewhere", "checkpoint_capture_failed", "checkpoint_budget_exceeded"}
)
ChangeKind = Literal["added", "modified", "deleted", "type_changed"]
#: Why a recorded checkpoint does not verify: the fact is then not backed and fails closed.
VerifyFailure = Literal[
    "checkpoint_missing",  # the ref does not exist
    "checkpoint_ref_moved",  # the ref names another commit than the recorded one
    "checkpoint_tree_mismatch",  # the commit's tree is not the recorded tree
    "checkpoint_objects_missing",  # an object of the tree is absent
    "checkpoint_objects_corrupt",  # an object's content does not hash to its id
]
VERIFY_FAILURES: Final[frozenset[str]] = frozenset(get_args(VerifyFailure))
#: The code a workspace whose contents differ from its checkpoint is refused with.
WORKSPACE_CONTENT_CHANGED: Final = "workspace_content_changed"
#: A checkpoint's Git names reach git's command line: an imported bundle must not pass an option
#: (``--output=...``) or a revision expression for one. The store is SHA-1 (``--object-format=sha1``).
CHECKPOINT_REF_PATTERN: Final = r"^refs/maka/checkpoints/[A-Za-z0-9_@%-]+/[0-9]+$"
OBJECT_ID_PATTERN: Final = r"^[0-9a-f]{40}$"
CheckpointRef = Annotated[str, Field(pattern=CHECKPOINT_REF_PATTERN)]
ObjectId = Annotated[str, Field(pattern=OBJECT_ID_PATTERN)]


class CheckpointModel(BaseModel):
    """Frozen, strict, camelCase on the wire, no unknown keys; optional keys absent, never null."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        strict=True,
        alias_generator=to_camel,
        populate_by_name=True,
        serialize_by_alias=True,
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            nulls = sorted(k for k, v in data.items() if v is None)
            if nulls:
                raise ValueError(f"{', '.join(nulls)} may be absent but not null")
        return data

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


class CheckpointPolicy(CheckpointModel):
    """How a workspace is captured; its hash is the boundary's ``checkpointPolicyHash``."""

    schema_: Literal["maka.checkpoint_policy/v1"] = Field(CHECKPOINT_POLICY_SCHEMA, alias="schema")
    carrier: Carrier = "git"
    max_files: int = Field(100_000, gt=0)
    max_bytes: int = Field(1 << 30, gt=0)

    def policy_hash(self) -> str:
        return digest(canonical_json.dumps(self.to_wire()))


class Checkpoint(CheckpointModel):
    """A captured workspace: a commit under a Maka-owned ref and the tree it holds."""

    carrier: Carrier = "git"
    ref: CheckpointRef  # refs/maka/checkpoints/<session>/<n>
    commit: ObjectId
    tree: ObjectId
    file_count: int = Field(ge=0)
    byte_count: int = Field(ge=0)
    #: Where the capturing host keeps its checkpoint stores (an absolute path on that host), so a
    #: reader on the same machine finds them whatever its own MAKA_HOME. Absent in older bundles.
    store: NonEmpty | None = None


class NoCheckpoint(CheckpointModel):
    """Why this workspace has no checkpoint (a stable code), and a human-readable detail."""

    code: NoCheckpointCode
    detail: str = ""


class WorkspaceBoundary(CheckpointModel):
    """The seed's ``WorkspaceBoundary``: a Runtime boundary bound to the workspace's contents."""

    workspace_identity: NonEmpty
    workspace_epoch: int = Field(ge=0)
    immutable_runtime_high_water: int = Field(ge=0)
    immutable_runtime_digest: Sha256Digest
    checkpoint_ref: NonEmpty | None = None
    checkpoint_policy_hash: Sha256Digest


class CheckpointBundle(CheckpointModel):
    """The one canonical bundle a boundary is committed as: exactly one of ``checkpoint`` (whose
    ref is the boundary's ``checkpointRef``) and ``noCheckpoint`` (and no ``checkpointRef``)."""

    schema_: Literal["maka.workspace_checkpoint/v1"] = Field(CHECKPOINT_BUNDLE_SCHEMA, alias="schema")
    boundary: WorkspaceBoundary
    checkpoint: Checkpoint | None = None
    no_checkpoint: NoCheckpoint | None = None

    @model_validator(mode="after")
    def _one_outcome(self) -> CheckpointBundle:
        if (self.checkpoint is None) == (self.no_checkpoint is None):
            raise ValueError("a bundle has exactly one of checkpoint and noCheckpoint")
        ref = None if self.checkpoint is None else self.checkpoint.ref
        if self.boundary.checkpoint_ref != ref:
            raise ValueError("boundary.checkpointRef must be the checkpoint's ref (absent without one)")
        return self

    @classmethod
    def of(
        cls, boundary_fields: dict[str, Any], outcome: Checkpoint | NoCheckpoint, policy: CheckpointPolicy
    ) -> CheckpointBundle:
        """The bundle for a capture's ``outcome``; ``boundary_fields`` are the Runtime half
        (``workspace_identity``, ``workspace_epoch``, ``immutable_runtime_high_water``,
        ``immutable_runtime_digest``)."""
        fields = {**boundary_fields, "checkpoint_policy_hash": policy.policy_hash()}
        if isinstance(outcome, Checkpoint):
            return cls(boundary=WorkspaceBoundary(**fields, checkpoint_ref=outcome.ref), checkpoint=outcome)
        return cls(boundary=WorkspaceBoundary(**fields), no_checkpoint=outcome)

    def encode(self) -> str:
        """The canonical JSON text (JavaScript key order and numbers, no whitespace)."""
        return canonical_json.dumps(self.to_wire())

    def digest(self) -> str:
        """``sha256:<hex>`` of the canonical text: the bundle's identity."""
        return digest(self.encode())

    @classmethod
    def decode(cls, text: str | bytes) -> CheckpointBundle:
        """Parse a stored bundle strictly: its exact shape, and only its canonical text.

        Raises:
            CheckpointError: ``checkpoint_bundle_invalid`` (not JSON, wrong shape or schema),
                ``checkpoint_bundle_not_canonical`` (same value, other bytes: its digest would lie).
        """
        try:
            value = canonical_json.loads(text)
            bundle = cls.model_validate(value)
        except (CodecError, ValidationError) as exc:
            raise CheckpointError("checkpoint_bundle_invalid", str(exc).splitlines()[0]) from None
        raw = text.decode("utf-8") if isinstance(text, bytes) else text
        if bundle.encode() != raw:
            raise CheckpointError(
                "checkpoint_bundle_not_canonical", "a stored bundle must be its canonical JSON text"
            )
        return bundle


class PathChange(CheckpointModel):
    """One path whose entry differs between a checkpoint and the workspace (never its content).
    A name that is not UTF-8 carries each undecodable byte as ``\\xNN``."""

    path: NonEmpty
    kind: ChangeKind


class WorkspaceDiff(CheckpointModel):
    """What differs between a checkpoint and the workspace now, sorted by path."""

    checkpoint_ref: NonEmpty
    changes: tuple[PathChange, ...] = ()

    @property
    def unchanged(self) -> bool:
        return not self.changes

    def refusal(self) -> CheckpointError | None:
        """``workspace_content_changed`` with the changed paths by kind, or None when unchanged."""
        if self.unchanged:
            return None
        by_kind: dict[str, list[str]] = {}
        for change in self.changes:
            by_kind.setdefault(change.kind, []).append(change.path)
        return CheckpointError(
            WORKSPACE_CONTENT_CHANGED,
            f"{len(self.changes)} path(s) differ from checkpoint {self.checkpoint_ref}",
            checkpointRef=self.checkpoint_ref,
            changedPaths=by_kind,
        )


class Verification(CheckpointModel):
    """Whether a recorded checkpoint is backed by its artifact: ``code`` is None when it is."""

    checkpoint_ref: NonEmpty
    code: VerifyFailure | None = None
    detail: str = ""

    @property
    def verified(self) -> bool:
        return self.code is None


class CheckpointProvider(Protocol):
    """Captures, verifies, compares and materializes workspace checkpoints. It observes; it never
    decides, so nothing it returns can stand for a resume approval."""

    carrier: Carrier
    policy: CheckpointPolicy

    def capture(self, workspace: Workspace, session_id: str) -> Checkpoint | NoCheckpoint:
        """Capture the workspace without changing the user's repository state; the artifact
        exists before the caller commits its fact (else it is an orphan that ``gc`` collects)."""
        ...

    def verify(self, workspace: Workspace, checkpoint: Checkpoint) -> Verification: ...

    def diff(self, workspace: Workspace, checkpoint: Checkpoint) -> WorkspaceDiff: ...

    def materialize(self, workspace: Workspace, checkpoint: Checkpoint, dest: Path) -> Path:
        """Build the checkpoint's files in the new directory ``dest`` (never the workspace)."""
        ...

    def gc(self, workspace: Workspace, keep: Collection[str]) -> tuple[str, ...]:
        """Delete the Maka refs not in ``keep``; the refs deleted."""
        ...


#: Where a terminal fact carries its workspace checkpoint bundle (``actions.stateDelta``).
CHECKPOINT_KEY: Final = "workspaceCheckpoint"


def bound_high_water(event: RuntimeEvent) -> int | None:
    """The runtime high-water a terminal fact's checkpoint bundle binds, read as stored (None when
    the fact carries no bundle, or none readable: decoding is the gate's, which fails closed)."""
    delta = event.actions.state_delta if event.actions is not None else None
    wire = delta.get(CHECKPOINT_KEY) if isinstance(delta, dict) else None
    boundary = wire.get("boundary") if isinstance(wire, dict) else None
    high_water = boundary.get("immutableRuntimeHighWater") if isinstance(boundary, dict) else None
    return high_water if isinstance(high_water, int) and not isinstance(high_water, bool) else None
