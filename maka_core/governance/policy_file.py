"""The governance policy file: MELRA's policy fields, plus what our tools need.

MELRA's fields where MELRA has one (``mutations``, ``capabilities``, ``deniedTraits``,
``unhinged``, ``allowedCommands``, ``approvalTtlMs``, the policy ``version``), and ours:
``forbiddenEffects`` (worker-wide, where MELRA has them per request), ``defaultEvidence`` per
tool, ``mutations: "allow"`` (MELRA knows only deny and confirm), ``trustedReadCommands``:
the read commands whose ``bash`` lines may run again after a crash (none by default: a ``bash``
call is ``at-most-once``, however harmless its line looks), and ``allowNetwork``: the session's
half of the two-key switch that gives ``bash`` the network (the worker's ``--bash-network`` is
the other; ``runtime.governed.network_for``). A file is parsed strictly:
an unknown key, a malformed grant or a lossy JSON value refuses the whole file with
``policy_invalid`` and the path of the offending field, because a grant that silently matched
nothing (or everything) would be worse than no policy.

``unhinged`` here is only the file's half of MELRA's two-key switch; whoever loads the policy
must also require the operator's own confirmation before honouring it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from maka_core.errors import CodecError, ConfigError
from maka_core.facts import canonical_json
from maka_core.facts.codec import digest as sha256_digest
from maka_core.governance.classify import GovernanceModel
from maka_core.governance.commands import TRUSTABLE_READ_COMMANDS, Trait, normalize_command_name
from maka_core.governance.evidence import EvidencePredicate
from maka_core.tools.base import Effect
from maka_core.tools.contract import ToolGuarantee
from maka_core.tools.offer import ToolSetInvalid, parse_tool_set

DEFAULT_POLICY_VERSION = "maka-policy/v1"
DEFAULT_APPROVAL_TTL_MS = 5 * 60_000
MutationsMode = Literal["allow", "confirm", "deny"]
PrincipalKind = Literal["organization", "human", "harness", "agent", "session", "subagent", "service"]

_Id = Annotated[str, StringConstraints(min_length=1, max_length=200)]


def _trustable(name: str) -> str:
    if name not in TRUSTABLE_READ_COMMANDS:
        raise ValueError(
            f"{name!r} is not a command maka can prove a read; one of {sorted(TRUSTABLE_READ_COMMANDS)}"
        )
    return name


_TrustedRead = Annotated[str, AfterValidator(_trustable)]


#: ``maxToolCallsPerStep`` when a policy does not say.
DEFAULT_MAX_TOOL_CALLS_PER_STEP = 64

class Principal(GovernanceModel):
    """Who acts: ``kind:id`` on the wire of receipts and grants."""

    kind: PrincipalKind
    id: _Id

    @property
    def ref(self) -> str:
        return f"{self.kind}:{self.id}"

    @classmethod
    def parse(cls, ref: str) -> Principal:
        """From ``kind:id``.

        Raises:
            ConfigError: ``principal_invalid`` for any other form or an unknown kind.
        """
        kind, sep, ident = ref.partition(":")
        try:
            if not sep:
                raise ValueError("no colon")
            return cls.model_validate({"kind": kind, "id": ident})
        except (ValueError, ValidationError):
            raise ConfigError("principal_invalid", f"a principal is kind:id, got {ref!r}") from None


class Identity(GovernanceModel):
    """The immediate principal and the delegation chain behind it, outermost first."""

    principal: Principal
    on_behalf_of: tuple[Principal, ...] = Field(default=(), max_length=7)

    @property
    def chain(self) -> str:
        """The delegation chain as one line, outermost first (MELRA's ``delegationChain``)."""
        return "/".join(p.ref for p in (*self.on_behalf_of, self.principal))


LOCAL_IDENTITY = Identity(principal=Principal(kind="agent", id="local"))


class CapabilityGrant(GovernanceModel):
    """Bounded authority issued by the operator: ``*`` in a pattern matches any run of characters."""

    id: _Id
    capability: _Id
    effects: tuple[Effect, ...] = Field(min_length=1, max_length=3)
    target: Annotated[str, StringConstraints(min_length=1, max_length=4096)] = "*"
    principal: _Id = "*"
    valid_until: datetime | None = None
    policy_version: Annotated[str, StringConstraints(max_length=64)] | None = None
    max_operations: int | None = Field(default=None, ge=1)

    @field_validator("valid_until")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("validUntil needs a time zone (e.g. 2026-01-01T00:00:00Z)")
        return value


class UsageLimits(GovernanceModel):
    """Token caps (``usage`` in a policy): each counts a step's vendor-reported ``total`` (input,
    cached input included, plus output), checked before every provider call (see
    ``maka_core.runtime.usage_limits``). Unset: no cap."""

    max_tokens_per_turn: int | None = Field(default=None, ge=1)
    max_tokens_per_session: int | None = Field(default=None, ge=1)


class GovernancePolicy(GovernanceModel):
    """Which calls may run, and on what terms. The defaults are MELRA's."""

    policy_version: Annotated[str, StringConstraints(min_length=1, max_length=64)] = DEFAULT_POLICY_VERSION
    mutations: MutationsMode = "confirm"
    capabilities: tuple[CapabilityGrant, ...] = Field(default=(), max_length=200)
    denied_traits: tuple[Trait, ...] = ()
    forbidden_effects: tuple[Effect, ...] = ()
    #: Command names ``bash`` and terminal operations may run, by basename; None: no allowlist
    #: (MELRA's always-denied names are refused either way).
    allowed_commands: tuple[Annotated[str, StringConstraints(min_length=1, max_length=512)], ...] | None = (
        None
    )
    #: Read commands a crash may run again: a ``bash`` line is ``read-only`` for recovery only
    #: when the classifier proves it is nothing but these commands (each a read) with literal
    #: arguments; every other ``bash`` call is ``at-most-once``. Empty: none (the default).
    trusted_read_commands: tuple[_TrustedRead, ...] = Field(default=(), max_length=64)
    approval_ttl_ms: int = Field(default=DEFAULT_APPROVAL_TTL_MS, ge=1_000, le=24 * 3_600_000)
    default_evidence: dict[str, tuple[EvidencePredicate, ...]] = Field(default_factory=dict)
    unhinged: bool = False
    #: Token caps per turn and per session (None: none).
    usage: UsageLimits | None = None
    #: The session's key to the network for ``bash`` (the worker's ``--bash-network`` is the other
    #: key): its sandbox keeps the host's network namespace. Contradicts ``deniedTraits: network``.
    allow_network: bool = False
    #: Per tool name, a guarantee narrower than the one the tool declares (``at-most-once`` for a
    #: tool you would rather park than re-run); a wider one is ignored: a policy narrows, never
    #: widens (``governance.guarantee.narrowed``). Left out of the digest when empty.
    tool_guarantees: dict[Annotated[str, StringConstraints(min_length=1, max_length=64)], ToolGuarantee] = (
        Field(default_factory=dict, max_length=500)
    )
    #: The tools a session under this policy may offer the model (``tools.offer``: groups and
    #: names); a session's own set is cut down to it. None: every tool. Left out of the digest
    #: when None.
    offered_tools: tuple[str, ...] | None = None

    @field_validator("offered_tools")
    @classmethod
    def _tool_set(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        try:
            return parse_tool_set(value, setting="offeredTools")
        except ToolSetInvalid as exc:
            raise ValueError(exc.message) from None

    #: After a crash, redo a file write whose target still holds its recorded before-state, through
    #: a guarded replacement (``tools.redo``); False parks it (``reconcile_matches_prior_state``) as
    #: before. Left out of the digest when true (the default).
    redo_interrupted_writes: bool = True
    #: The most calls one model step may ask for: past it every call of the step is refused
    #: (``tool_calls_per_step_exceeded``, a committed error result before any T1). Left out of the
    #: digest at its default.
    max_tool_calls_per_step: int = Field(default=DEFAULT_MAX_TOOL_CALLS_PER_STEP, ge=1, le=10_000)

    @field_validator("allow_network")
    @classmethod
    def _network_not_denied(cls, value: bool, info: ValidationInfo) -> bool:
        if value and "network" in info.data.get("denied_traits", ()):
            raise ValueError("allowNetwork contradicts deniedTraits: network (say one or the other)")
        return value

    @property
    def allowed_command_names(self) -> frozenset[str] | None:
        if self.allowed_commands is None:
            return None
        return frozenset(normalize_command_name(c) for c in self.allowed_commands)

    @property
    def trusted_reads(self) -> frozenset[str]:
        return frozenset(self.trusted_read_commands)

    def to_json(self) -> dict[str, Any]:
        """The normalized policy (defaults filled in) as JSON: what ``digest`` covers."""
        value: dict[str, Any] = self.model_dump(mode="json", by_alias=True)
        # None and an absent field mean the same here; drop them so the digest does not care.
        value["capabilities"] = [
            {k: v for k, v in grant.items() if v is not None} for grant in value["capabilities"]
        ]
        if value["allowedCommands"] is None:
            del value["allowedCommands"]
        # Absent before it existed: an empty list must not change the digest of older policies.
        if not value["trustedReadCommands"]:
            del value["trustedReadCommands"]
        if not value["allowNetwork"]:
            del value["allowNetwork"]
        if value["redoInterruptedWrites"]:
            del value["redoInterruptedWrites"]
        if not value["toolGuarantees"]:
            del value["toolGuarantees"]
        if value["maxToolCallsPerStep"] == DEFAULT_MAX_TOOL_CALLS_PER_STEP:
            del value["maxToolCallsPerStep"]
        if value["offeredTools"] is None:
            del value["offeredTools"]
        # Likewise for token caps: only a set cap is part of what the digest covers.
        usage = {k: v for k, v in (value.pop("usage") or {}).items() if v is not None}
        if usage:
            value["usage"] = usage
        return value

    @cached_property
    def digest(self) -> str:
        """``sha256:<hex>`` of the canonical JSON of the normalized policy (computed once: the
        policy is frozen, and every decision and receipt of its session names it)."""
        return sha256_digest(canonical_json.dumps(self.to_json()))

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy, with its digest computed afresh (an update may change what it covers)."""
        copy = super().model_copy(update=update, deep=deep)
        copy.__dict__.pop("digest", None)
        return copy


_UNION_TAGS = frozenset(
    {
        "result_equals",
        "result_contains",
        "file_exists",
        "file_absent",
        "file_hash",
        "exit_code",
        "tool_succeeded",
    }
)


def _field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for index, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _UNION_TAGS and index + 1 < len(loc):
            continue  # pydantic names the union member it tried; that is not a field
        else:
            out += f".{part}" if out else part
    return out or "$"


def parse_policy(value: Any, *, source: str = "<policy>") -> GovernancePolicy:
    """Validate an already-parsed JSON policy.

    Raises:
        ConfigError: ``policy_invalid`` with ``field`` (e.g. ``capabilities[2].target``).
    """
    if not isinstance(value, dict):
        raise ConfigError("policy_invalid", f"{source}: a policy is a JSON object", path=source, field="$")
    try:
        text = canonical_json.dumps(value)
    except CodecError as exc:
        raise ConfigError("policy_invalid", f"{source}: {exc.message}", path=source, field="$") from None
    try:
        # Strict, through JSON: "true" is not a boolean and "1" is not a number in a policy.
        return GovernancePolicy.model_validate_json(text, strict=True, by_alias=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = _field_path(tuple(first["loc"]))
        raise ConfigError(
            "policy_invalid", f"{source}: {where}: {first['msg']}", path=source, field=where
        ) from None


def load_policy(path: str | Path) -> GovernancePolicy:
    """Read and validate a policy file (UTF-8 JSON; duplicate keys and lossy numbers refused).

    Raises:
        ConfigError: ``policy_invalid`` for an unreadable, non-JSON or invalid file.
    """
    source = str(path)
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError("policy_invalid", f"cannot read {source}: {exc.strerror}", path=source) from None
    try:
        value = canonical_json.loads(text)
    except CodecError as exc:
        raise ConfigError("policy_invalid", f"{source}: {exc.message}", path=source, field="$") from None
    return parse_policy(value, source=source)
