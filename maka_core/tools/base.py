"""The tool contract: what every tool declares, what it returns, and the file evidence it records.

A tool call goes preflight -> (evidence) -> T1 -> run -> T2. ``preflight`` refuses bad calls before
any fact exists; ``capture_evidence`` describes, before T1, the one file the call will change, so a
crash between T1 and T2 can later be settled by *observing* that file (``reconcile``) instead of
re-running the call. Results are JSON values committed as ``function_response.result``; refusals
and failures are ordinary results with ``is_error`` set, never exceptions that escape a tool.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, Self, runtime_checkable

from pydantic import BaseModel, ConfigDict, ValidationError

from maka_core.errors import MakaError
from maka_core.facts import canonical_json
from maka_core.facts.events import Observation, RecoveryMode

if TYPE_CHECKING:
    from maka_core.workspace import Workspace

Effect = Literal["read", "mutate", "destructive"]
EFFECTS: frozenset[str] = frozenset({"read", "mutate", "destructive"})

#: Default cap on a result's serialized size (canonical JSON, UTF-8 bytes).
DEFAULT_RESULT_BYTE_LIMIT = 64 * 1024
#: Largest file the file tools read, hash or write (MELRA's ``maxFileBytes``).
DEFAULT_MAX_FILE_BYTES = 10 * 1024 * 1024

FILE_EVIDENCE_SCHEMA: Literal["maka.file_evidence/v1"] = "maka.file_evidence/v1"
_SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class ToolResult:
    """A tool's outcome, committed as ``function_response.result`` / ``isError``.

    ``result`` is ``{"kind": "text", "text": ...}`` or ``{"kind": "json", "value": ...}``; an error
    is ``{"kind": "json", "value": {"code": ..., "message": ...}}`` with ``is_error=True``.
    """

    result: Any
    is_error: bool = False

    @classmethod
    def text(cls, text: str) -> ToolResult:
        """A successful plain-text result."""
        return cls({"kind": "text", "text": text})

    @classmethod
    def json(cls, value: Any, *, is_error: bool = False) -> ToolResult:
        """A JSON result (successful unless ``is_error``)."""
        return cls({"kind": "json", "value": value}, is_error)

    @classmethod
    def error(cls, code: str, message: str, **detail: Any) -> ToolResult:
        """An error result with a stable machine ``code``."""
        value = {"code": code, "message": message, **{k: v for k, v in detail.items() if v is not None}}
        return cls({"kind": "json", "value": value}, True)

    @property
    def error_code(self) -> str | None:
        """The machine code of an error result, else None."""
        if not self.is_error or not isinstance(self.result, dict):
            return None
        value = self.result.get("value")
        code = value.get("code") if isinstance(value, dict) else None
        return code if isinstance(code, str) else None

    def serialized_size(self) -> int:
        """UTF-8 bytes of the canonical JSON of ``result``: what the byte limit counts."""
        return len(canonical_json.dumps(self.result).encode("utf-8"))


class ToolRefusal(MakaError):
    """A call refused for a stated reason (bad args, path escape...); becomes an error result."""

    default_code = "tool_refused"

    def to_result(self) -> ToolResult:
        """The committed error result for this refusal."""
        return ToolResult.error(self.code, self.message, **self.detail)


def enforce_result_limit(result: ToolResult, limit: int) -> ToolResult:
    """Replace a result whose serialized size exceeds ``limit`` by ``tool_result_too_large``.

    Never truncates: a silently shortened file or log would look complete to the model.
    """
    size = result.serialized_size()
    if size <= limit:
        return result
    return ToolResult.error(
        "tool_result_too_large",
        f"the result is {size} bytes, over the {limit}-byte limit; ask for less output",
        size=size,
        limit=limit,
    )


# --- file evidence -------------------------------------------------------------------------


def _evidence_error(message: str) -> MakaError:
    return MakaError("evidence_invalid", message)


@dataclass(frozen=True)
class FileIdentity:
    """The identity of a file's content: ``sha256:<hex>`` of its bytes and its size."""

    sha256: str
    size: int

    def __post_init__(self) -> None:
        if not isinstance(self.sha256, str) or not _SHA256.match(self.sha256):
            raise _evidence_error("sha256 must be sha256:<64 hex>")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise _evidence_error("size must be a non-negative integer")

    @classmethod
    def of(cls, data: bytes) -> FileIdentity:
        """The identity of ``data``."""
        from maka_core.facts.codec import digest

        return cls(digest(data), len(data))

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "size": self.size}

    @classmethod
    def from_json(cls, value: Any) -> FileIdentity:
        if not isinstance(value, dict) or set(value) != {"sha256", "size"}:
            raise _evidence_error("a file identity is {sha256, size}")
        return cls(value["sha256"], value["size"])


@dataclass(frozen=True)
class FileEvidence:
    """What a file tool will do to one file, durable with its T1 (dispatch) fact.

    Bound to the call by ``args_hash`` (``canonicalArgsHash`` of the tool name and args) and to
    the workspace by its identity. The boundaries say what the reconciler may trust: the target
    is a regular file reached without following a final symlink, at most ``max_bytes`` long,
    holding UTF-8 text (``encoding``); anything else observed there is ``unreadable`` or
    ``diverged``, never a guess.
    """

    workspace_identity: str
    target: str  # canonical path relative to the workspace root, "/"-separated
    before: FileIdentity | None  # None: the file was absent
    expected_after: FileIdentity
    transform: str  # "write_file/v1", "edit_file/v1"
    max_bytes: int
    tool_name: str
    args_hash: str
    encoding: Literal["utf-8"] = "utf-8"
    file_kind: Literal["regular"] = "regular"
    follow_symlinks: Literal[False] = False

    def to_json(self) -> dict[str, Any]:
        """The JSON object the store keeps with T1."""
        return {
            "schema": FILE_EVIDENCE_SCHEMA,
            "workspaceIdentity": self.workspace_identity,
            "target": self.target,
            "before": None if self.before is None else self.before.to_json(),
            "expectedAfter": self.expected_after.to_json(),
            "transform": self.transform,
            "maxBytes": self.max_bytes,
            "toolName": self.tool_name,
            "argsHash": self.args_hash,
            "encoding": self.encoding,
            "fileKind": self.file_kind,
            "followSymlinks": self.follow_symlinks,
        }

    @classmethod
    def from_json(cls, value: Any) -> FileEvidence:
        """Parse stored evidence strictly.

        Raises:
            MakaError: ``evidence_invalid`` for any other shape or schema.
        """
        keys = {
            "schema", "workspaceIdentity", "target", "before", "expectedAfter", "transform",
            "maxBytes", "toolName", "argsHash", "encoding", "fileKind", "followSymlinks",
        }  # fmt: skip
        if not isinstance(value, dict) or set(value) != keys:
            raise _evidence_error(f"file evidence must have exactly the keys {sorted(keys)}")
        if value["schema"] != FILE_EVIDENCE_SCHEMA:
            raise _evidence_error(f"unknown evidence schema {value['schema']!r}")
        if (
            value["encoding"] != "utf-8"
            or value["fileKind"] != "regular"
            or value["followSymlinks"] is not False
        ):
            raise _evidence_error("unsupported evidence boundaries")
        for key in ("workspaceIdentity", "target", "transform", "toolName", "argsHash"):
            if not isinstance(value[key], str) or not value[key]:
                raise _evidence_error(f"{key} must be a non-empty string")
        max_bytes = value["maxBytes"]
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise _evidence_error("maxBytes must be a non-negative integer")
        return cls(
            workspace_identity=value["workspaceIdentity"],
            target=value["target"],
            before=None if value["before"] is None else FileIdentity.from_json(value["before"]),
            expected_after=FileIdentity.from_json(value["expectedAfter"]),
            transform=value["transform"],
            max_bytes=max_bytes,
            tool_name=value["toolName"],
            args_hash=value["argsHash"],
        )


def parse_evidence(value: Any) -> Any:
    """Stored evidence as its tool reads it: ``FileEvidence`` for the file tools' schema (parsed
    strictly: ``evidence_invalid``), any other tool's JSON object as it was committed."""
    if isinstance(value, dict) and value.get("schema") == FILE_EVIDENCE_SCHEMA:
        return FileEvidence.from_json(value)
    return value


@dataclass(frozen=True)
class Reconciliation:
    """What a reconciler observed for an operation that has T1 but no T2.

    ``recovered`` is the result the tool would have returned, set only for
    ``matches_expected_state`` (the effect is there, so the call is finalized, never redone).
    """

    observation: Observation
    observation_digest: str
    recovered: ToolResult | None = None
    observed: Any = None  # the observed state as JSON (what ``observation_digest`` digests)


Heartbeat = Callable[[], None]


@runtime_checkable
class Tool(Protocol):
    """One tool as the runtime sees it. Implementations are stateless apart from configuration.

    Besides these members a tool may declare, and the runtime reads, never looking a tool up by
    its name or class: ``effects``, ``capability`` (``file.read``; default ``tool.<name>``) or its
    own ``classify(args)`` (``bash``), ``permission_reason``, ``guarantee`` (a contract tool's
    ``ToolGuarantee``), ``for_call(CallContext)`` (bound per call: ``tools.contract``),
    ``binds_to_session`` (the MELRA tools), and, once bound to a task, ``subject`` and
    ``present``. Stored evidence reaches ``reconcile`` as ``parse_evidence`` reads it.
    """

    # Read-only members, so tools may declare them as class constants.
    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def parameters(self) -> dict[str, Any]:
        """JSON schema of the args, for providers."""
        ...

    @property
    def recovery_mode(self) -> RecoveryMode: ...
    @property
    def mutates(self) -> bool: ...

    def preflight(self, args: dict[str, Any], ws: Workspace) -> ToolResult | None:
        """None when admitted; otherwise the error result to commit before T1."""
        ...

    def capture_evidence(self, args: dict[str, Any], ws: Workspace) -> FileEvidence | None:
        """Evidence to commit with T1 (None for tools that change no single file)."""
        ...

    def run(self, args: dict[str, Any], ws: Workspace, heartbeat: Heartbeat) -> ToolResult:
        """Perform the call (synchronous; the activity runs it in a thread)."""
        ...

    def reconcile(
        self, args: dict[str, Any], ws: Workspace, evidence: FileEvidence | None
    ) -> Reconciliation | None:
        """Observe, never write; None when the tool has no reconciler. ``evidence`` is what
        ``parse_evidence`` makes of the evidence committed with T1 (a contract tool's own JSON)."""
        ...


@runtime_checkable
class GuardedWrite(Protocol):
    """A write tool whose write is conditional on its T1 evidence, and that recovery may redo
    (``tools.redo``): the file tools."""

    def with_evidence(self, evidence: FileEvidence) -> Self:
        """This tool for the call dispatched with ``evidence``: its write replaces the target only
        while it holds the recorded before-state (a late original refuses ``target_diverged``)."""
        ...

    def with_fence(self, live: Callable[[], bool]) -> Self:
        """This tool for a call whose write first asks ``live`` (holding the target folder's
        lock): False once recovery has taken the call over (``store.fences``), and then nothing
        is written (``AttemptSuperseded``)."""
        ...

    def redo(
        self,
        args: dict[str, Any],
        ws: Workspace,
        evidence: FileEvidence,
        prior: Reconciliation,
        run: int | None,
    ) -> Reconciliation:
        """Recovery's guarded redo (``run``: the number ``record_rerun`` gave it; None when a redo
        was recorded before this recovery, which then only settles)."""
        ...


def tool_effects(tool: Tool) -> frozenset[str]:
    """The effects a tool may have: its declared ``effects`` or, failing that, from ``mutates``."""
    declared = getattr(tool, "effects", None)
    if isinstance(declared, frozenset):
        return declared
    return frozenset({"mutate"}) if tool.mutates else frozenset({"read"})


def permission_reason(tool: Tool) -> str:
    """What a permission request for a call of ``tool`` says it is: its declared
    ``permission_reason`` (``shell_dangerous``, ``file_write``), else ``custom``."""
    declared = getattr(tool, "permission_reason", None)
    return declared if isinstance(declared, str) else "custom"


# --- the built-in tools' arguments: one model each ------------------------------------------


class ToolArgs(BaseModel):
    """A built-in tool's arguments: exactly its fields, each strictly of its type."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def args_schema(model: type[ToolArgs]) -> dict[str, Any]:
    """The provider-facing schema of a built-in's argument model, in the shape providers have
    always been sent (``type``, ``properties`` with each field's type and description,
    ``required``, ``additionalProperties: false``; no pydantic titles)."""
    raw = model.model_json_schema()
    properties = {
        name: {"type": p["type"], **({"description": p["description"]} if "description" in p else {})}
        for name, p in raw["properties"].items()
    }
    return {
        "type": "object",
        "properties": properties,
        "required": list(raw.get("required", [])),
        "additionalProperties": False,
    }


def check_args(model: type[ToolArgs], args: Any, *, tool: str) -> dict[str, Any]:
    """``args`` as ``model`` admits them (exactly its keys, each of its type); raises
    ``ToolRefusal(invalid_args)`` naming what is wrong."""
    if not isinstance(args, dict):
        raise ToolRefusal("invalid_args", f"{tool} takes a JSON object of arguments")
    try:
        model.model_validate(args)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
            for e in exc.errors(include_url=False, include_input=False)
        )
        fields = sorted(model.model_fields)
        raise ToolRefusal("invalid_args", f"{tool} takes exactly {fields}: {problems}") from None
    return args
