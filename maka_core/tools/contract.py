"""The one tool contract: what a tool declares and ``@tool`` (how the runtime drives one call of it:
``tools.bound_call``).

A tool declares its name, a description, one argument model (a pydantic model: the provider-facing
JSON schema is derived from it and arguments are validated by it), or, for a tool whose schema comes
from elsewhere (an MCP server), a raw JSON schema and the validator that enforces it; its effects;
and its execution guarantee in MELRA's words (``ToolGuarantee``). Optional hooks: ``preflight``
(refuse before T1 by raising ``ToolRefusal``: an ordinary committed error result, no T1),
``evidence`` (any JSON object the tool defines, versioned by its ``"schema"`` key, captured before
T1, committed with it and handed back to ``reconcile`` after a crash), ``reconcile`` (observe, never
write: finalize-only). Each hook may be sync or async, like ``run``. ``preflight`` and ``evidence``
run before T1 on the ledger's thread, which waits for them: keep them quick (no slow network round
trip).

What the guarantee buys after a crash between T1 (dispatch) and T2 (outcome):

- ``read-only``: the call runs again (there is no effect to repeat);
- ``provider-idempotent``, ``at-least-once``: the call runs again with the same
  ``ToolContext.idempotency_key`` (derived from the session and operation ids, recorded with T1);
- ``reconciliation-required``: ``reconcile(args, evidence, ctx)`` settles it from the committed
  evidence, or the operation parks (``reconcile_diverged``, ``reconcile_unreadable``);
- ``at-most-once``: the operation parks ``dispatch_without_response``; it never runs twice.

``run(args, ctx)`` may be sync (it runs in a tool thread) or async (it is awaited on the worker's
event loop, the one its activities run on, so it may share long-lived clients across calls).
It returns a JSON value, a string (a text result), a pydantic model (its JSON) or a
``ToolResult``; raising is an ordinary committed error result (``ToolRefusal`` keeps its code,
anything else is ``tool_failed``), never a worker crash.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import re
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, get_args

from pydantic import BaseModel, ValidationError

from maka_core.errors import ConfigError, MakaError
from maka_core.facts import canonical_json
from maka_core.facts.codec import digest
from maka_core.facts.events import Observation, RecoveryMode
from maka_core.tools.base import (
    DEFAULT_RESULT_BYTE_LIMIT,
    EFFECTS,
    Effect,
    ToolRefusal,
)

if TYPE_CHECKING:
    pass

JsonValue: TypeAlias = Any

#: What a tool may declare about running it more than once (MELRA's execution guarantees).
ToolGuarantee = Literal[
    "read-only", "at-most-once", "reconciliation-required", "provider-idempotent", "at-least-once"
]
TOOL_GUARANTEES: tuple[ToolGuarantee, ...] = get_args(ToolGuarantee)
#: The guarantees whose call runs again after a crash, with the same idempotency key.
KEYED_GUARANTEES: frozenset[str] = frozenset({"provider-idempotent", "at-least-once"})
#: How much each guarantee lets recovery re-run (higher: more), the one order every narrowing
#: moves down (a policy's ``toolGuarantees``, an MCP servers file): ``at-least-once`` is narrower
#: than ``provider-idempotent`` (both re-run with one key; it promises no dedup), and neither a
#: reconciling nor an at-most-once call is ever re-run.
GUARANTEE_LATITUDE: Mapping[str, int] = {
    "read-only": 3,
    "provider-idempotent": 2,
    "at-least-once": 1,
    "reconciliation-required": 0,
    "at-most-once": 0,
}

#: The T1 fact's ``recoveryMode`` (the reference's vocabulary) for each guarantee.
RECOVERY_MODES: dict[ToolGuarantee, RecoveryMode] = {
    "read-only": "replay_safe",
    "provider-idempotent": "idempotent",
    "at-least-once": "idempotent",
    "reconciliation-required": "reconcile",
    "at-most-once": "never_auto_retry",
}

#: A name providers accept for a function (OpenAI's and Anthropic's common rule).
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
IDEMPOTENCY_KEY_PREFIX = "maka-idem-"
#: How long an async ``preflight`` or ``evidence`` hook may take (seconds): it runs before T1 and
#: the ledger's thread waits for it (``FunctionTool(hook_timeout_s=)`` sets a tool's own).
DEFAULT_HOOK_TIMEOUT_S = 10.0


class ToolsInvalid(ConfigError):
    """A tool definition (or a ``--tools`` entry) that cannot be served; the detail names it."""

    default_code = "tools_invalid"


class OutcomeUnknown(MakaError):
    """Raised by a tool whose request went out and got no answer (a server that died mid-call): the
    effect may or may not have happened. T2 does not commit; the guarantee decides recovery."""

    default_code = "tool_outcome_unknown"


class ToolArgsInvalid(ToolRefusal):
    """Arguments the tool's model refuses: a committed error result before T1 (the model sees it)."""

    default_code = "tool_args_invalid"


def idempotency_key(session_id: str, operation_id: str) -> str:
    """The key a call presents on every attempt, worker and host: a pure function of its identity."""
    material = f"{session_id}\x00{operation_id}".encode()
    return IDEMPOTENCY_KEY_PREFIX + hashlib.sha256(material).hexdigest()[:32]


def no_heartbeat() -> None:
    return None


def never_cancelled() -> bool:
    return False


@dataclass(frozen=True)
class ToolContext:
    """What one attempt of one call knows about itself.

    ``idempotency_key`` is identical on every attempt of the operation (recorded with its T1);
    ``attempt`` counts runs of the effect (1 for the first, more only for a guarantee that allows
    a re-run). ``heartbeat()`` tells the worker the call is alive and raises once the attempt is
    cancelled (let it propagate: the effect is abandoned and T2 never commits); ``cancelled`` says
    so without raising.
    """

    tool_name: str
    session_id: str
    operation_id: str
    idempotency_key: str
    workspace_root: Path
    attempt: int = 1
    guarantee: ToolGuarantee = "at-most-once"
    _beat: Callable[[], None] = field(default=no_heartbeat, repr=False, compare=False)
    _is_cancelled: Callable[[], bool] = field(default=never_cancelled, repr=False, compare=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False, compare=False)

    def heartbeat(self) -> None:
        """Report liveness; raises when the attempt was cancelled (stop the effect)."""
        self._beat()

    @property
    def cancelled(self) -> bool:
        """Whether the attempt was cancelled (the next ``heartbeat()`` raises)."""
        return self._is_cancelled()


@dataclass(frozen=True)
class Reconciled:
    """What ``reconcile`` observed for a call dispatched without an outcome.

    ``matches_expected_state`` (``Reconciled.done``) settles the call with ``result``, the result
    it would have returned; any other observation parks it. ``observed`` is what was seen, as JSON
    (digested into the reconcile fact).
    """

    observation: Observation
    result: JsonValue = None
    observed: JsonValue = None

    @classmethod
    def done(cls, result: JsonValue, observed: JsonValue = None) -> Reconciled:
        """The effect is there: finalize with ``result``."""
        return cls("matches_expected_state", result, observed)

    @classmethod
    def not_applied(cls, observed: JsonValue = None) -> Reconciled:
        """The target is as it was before the call: park ``reconcile_matches_prior_state``."""
        return cls("matches_prior_state", None, observed)

    @classmethod
    def diverged(cls, observed: JsonValue = None) -> Reconciled:
        """Neither the expected state nor the prior one: park ``reconcile_diverged``."""
        return cls("diverged", None, observed)

    @classmethod
    def unreadable(cls, observed: JsonValue = None) -> Reconciled:
        """The target could not be observed: park ``reconcile_unreadable``."""
        return cls("unreadable", None, observed)


Run = Callable[[Any, ToolContext], Any]
Validate = Callable[[dict[str, Any]], Any]
EvidenceHook = Callable[[Any, ToolContext], JsonValue]
ReconcileHook = Callable[[Any, JsonValue, ToolContext], "Reconciled | Awaitable[Reconciled]"]
PreflightHook = Callable[[Any, ToolContext], "Awaitable[None] | None"]


def _invalid(name: str, message: str) -> ToolsInvalid:
    return ToolsInvalid(message=f"tool {name!r}: {message}", tool=name)


def schema_digest(parameters: Mapping[str, Any]) -> str:
    """The digest of a provider-facing argument schema (what the tool catalog compares)."""
    return digest(canonical_json.dumps(dict(parameters)))


class FunctionTool:
    """A tool built from functions: by ``@tool`` or programmatically (an MCP adapter).

    Give either ``args_model`` (a pydantic model: schema and validation from it) or ``parameters``
    (a JSON schema) with ``validate`` (returns the arguments ``run`` receives, raises
    ``ToolArgsInvalid``, ``ValueError`` or ``ValidationError`` to refuse them). ``effects``
    defaults from the guarantee (``read`` for ``read-only``, else ``mutate``); a tool that may
    mutate must declare a guarantee other than ``read-only``; ``effects=["read"]`` alone is a
    read. One declaring neither is ``at-most-once`` with ``mutate``: a tool that forgot to say
    what it does is never run again after a crash (``send_email`` judged a read would be).

    Raises:
        ToolsInvalid: ``tools_invalid`` naming the tool, for any contradiction above, a name
            providers refuse, a model without a JSON schema, or ``reconciliation-required``
            without ``reconcile``.
    """

    def __init__(
        self,
        *,
        name: str,
        run: Run,
        description: str = "",
        guarantee: ToolGuarantee | None = None,
        effects: Iterable[Effect] | None = None,
        args_model: type[BaseModel] | None = None,
        parameters: Mapping[str, Any] | None = None,
        validate: Validate | None = None,
        evidence: EvidenceHook | None = None,
        reconcile: ReconcileHook | None = None,
        preflight: PreflightHook | None = None,
        result_byte_limit: int = DEFAULT_RESULT_BYTE_LIMIT,
        hook_timeout_s: float = DEFAULT_HOOK_TIMEOUT_S,
        bound_s: float | None = None,
        parallel: bool | None = None,
    ) -> None:
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise _invalid(str(name), "a name is 1-64 of A-Z a-z 0-9 _ -")
        if guarantee is not None and guarantee not in TOOL_GUARANTEES:
            raise _invalid(name, f"guarantee must be one of {list(TOOL_GUARANTEES)}, not {guarantee!r}")
        declared = None if effects is None else frozenset(effects)
        if declared is not None and (not declared or not declared <= EFFECTS):
            raise _invalid(name, f"effects must be a non-empty subset of {sorted(EFFECTS)}")
        mutates = declared is not None and declared != {"read"}
        if guarantee is None:
            if mutates:
                raise _invalid(name, "a tool that mutates must declare guarantee=")
            guarantee = "read-only" if declared is not None else "at-most-once"
        if guarantee == "read-only" and mutates:
            raise _invalid(name, "a read-only tool cannot declare mutating effects")
        if declared is None:
            declared = frozenset({"read"}) if guarantee == "read-only" else frozenset({"mutate"})
        if guarantee == "reconciliation-required" and reconcile is None:
            raise _invalid(name, "reconciliation-required needs a reconcile= hook")
        if bound_s is not None and not (isinstance(bound_s, int | float) and 0 < bound_s <= 3600):
            raise _invalid(name, "bound_s is a number of seconds in (0, 3600]")
        if parallel is not None and not isinstance(parallel, bool):
            raise _invalid(name, "parallel is True or False")
        if (args_model is None) == (parameters is None):
            raise _invalid(name, "give exactly one of args_model and parameters")
        if args_model is not None:
            if not (isinstance(args_model, type) and issubclass(args_model, BaseModel)):
                raise _invalid(name, "the argument model must be a pydantic BaseModel subclass")
            try:
                schema = args_model.model_json_schema()
            except Exception as exc:
                raise _invalid(name, f"the argument model has no JSON schema ({exc})") from None
            model = args_model
            validate = validate or (lambda args: model.model_validate(args))
        else:
            assert parameters is not None
            if validate is None:
                raise _invalid(name, "a raw parameters schema needs its validate= function")
            schema = dict(parameters)
        if schema.get("type") != "object":
            raise _invalid(name, "the argument schema must describe a JSON object")
        try:
            canonical_json.dumps(schema)
        except MakaError as exc:
            raise _invalid(name, f"the argument schema is not JSON ({exc.message})") from None
        self.name = name
        self.description = description.strip() or name
        self.guarantee: ToolGuarantee = guarantee
        self.effects: frozenset[Effect] = declared
        self.args_model = args_model
        self.parameters: dict[str, Any] = schema
        self.schema_digest = schema_digest(schema)
        self._validate: Validate = validate
        self.run_fn = run
        self.evidence_fn = evidence
        self.reconcile_fn = reconcile
        self.preflight_fn = preflight
        #: The largest result committed (canonical JSON bytes): a larger one is
        #: ``tool_result_too_large``, as for every built-in.
        self.result_byte_limit = result_byte_limit
        if not hook_timeout_s > 0:
            raise _invalid(name, "hook_timeout_s is positive")
        self.hook_timeout_s = hook_timeout_s
        #: The longest one call takes, declared by the tool (seconds; ``None``: no bound declared).
        #: A ``read-only`` tool with a short bound may run as a local activity in a hybrid session
        #: (``runtime.local_calls``); nothing enforces it but the local attempt's start-to-close.
        self.bound_s = bound_s
        #: Whether a call may run beside the other calls of its model step (``parallel_safe``);
        #: ``None``: as its guarantee says (``read-only`` calls may, every other call not).
        self.parallel = parallel

    def __repr__(self) -> str:
        return f"FunctionTool({self.name!r}, guarantee={self.guarantee!r})"

    # --- what the runtime reads -----------------------------------------------------------

    @property
    def recovery_mode(self) -> RecoveryMode:
        return RECOVERY_MODES[self.guarantee]

    @property
    def mutates(self) -> bool:
        return self.effects != {"read"}

    def parse_args(self, args: dict[str, Any]) -> Any:
        """The arguments ``run`` receives.

        Raises:
            ToolArgsInvalid: what the model (or validator) refused, with its errors.
        """
        try:
            return self._validate(args)
        except ToolArgsInvalid:
            raise
        except ValidationError as exc:
            errors = [
                {"loc": ".".join(str(p) for p in e["loc"]), "msg": e["msg"], "type": e["type"]}
                for e in exc.errors(include_url=False, include_input=False)
            ]
            raise ToolArgsInvalid(
                message=f"{self.name}: the arguments do not fit its model", errors=errors
            ) from None
        except (ValueError, TypeError) as exc:
            raise ToolArgsInvalid(message=f"{self.name}: {exc}") from None


def tool(
    fn: Run | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    guarantee: ToolGuarantee | None = None,
    effects: Iterable[Effect] | None = None,
    evidence: EvidenceHook | None = None,
    reconcile: ReconcileHook | None = None,
    preflight: PreflightHook | None = None,
    hook_timeout_s: float = DEFAULT_HOOK_TIMEOUT_S,
    bound_s: float | None = None,
    parallel: bool | None = None,
) -> Any:
    """Make ``fn(args: YourModel, ctx: ToolContext)`` a tool (``@tool`` or ``@tool(...)``).

    The argument model is the annotation of the first parameter; the name defaults to the
    function's, the description to its docstring. See ``FunctionTool`` for the rules.
    """

    def make(f: Run) -> FunctionTool:
        tool_name: str = name or str(getattr(f, "__name__", ""))
        try:
            hints = typing.get_type_hints(f)
        except Exception as exc:
            raise _invalid(tool_name, f"its annotations do not resolve ({exc})") from None
        params = list(inspect.signature(f).parameters)
        model = hints.get(params[0]) if params else None
        if model is None or not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise _invalid(tool_name, "the first parameter must be annotated with a pydantic model")
        return FunctionTool(
            name=tool_name,
            run=f,
            description=description if description is not None else inspect.getdoc(f) or "",
            guarantee=guarantee,
            effects=effects,
            args_model=model,
            evidence=evidence,
            reconcile=reconcile,
            preflight=preflight,
            hook_timeout_s=hook_timeout_s,
            bound_s=bound_s,
            parallel=parallel,
        )

    return make if fn is None else make(fn)


def parallel_safe(tool: Any, guarantee: str | None) -> bool:
    """Whether a call of ``tool``, judged ``guarantee`` for its arguments, may run beside the other
    calls of its model step: the tool's own ``parallel`` when it declares one (``@tool(parallel=)``;
    ``bash`` declares ``False``), else only a ``read-only`` call (an MCP tool's guarantee is its
    annotations as the trust rules judge them). A call that is not runs alone, in the model's order."""
    declared = getattr(tool, "parallel", None)
    if isinstance(declared, bool):
        return declared
    return guarantee == "read-only"


def tool_catalog(tools: Mapping[str, Any]) -> dict[str, str]:
    """Every tool's name and the digest of its provider-facing argument schema."""
    return {name: schema_digest(t.parameters) for name, t in sorted(tools.items())}
