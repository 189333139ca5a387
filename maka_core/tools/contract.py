"""The one tool contract: what a tool declares, how the runtime calls it, and ``@tool``.

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
import concurrent.futures
import hashlib
import inspect
import re
import time
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, get_args

from pydantic import BaseModel, ValidationError

from maka_core import failpoints
from maka_core.errors import ConfigError, MakaError
from maka_core.facts import canonical_json
from maka_core.facts.codec import digest
from maka_core.facts.events import Observation, RecoveryMode
from maka_core.tools.base import (
    DEFAULT_RESULT_BYTE_LIMIT,
    EFFECTS,
    Effect,
    Reconciliation,
    ToolRefusal,
    ToolResult,
    enforce_result_limit,
)

if TYPE_CHECKING:
    from maka_core.workspace import Workspace

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


def _no_heartbeat() -> None:
    return None


def _never() -> bool:
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
    _beat: Callable[[], None] = field(default=_no_heartbeat, repr=False, compare=False)
    _is_cancelled: Callable[[], bool] = field(default=_never, repr=False, compare=False)
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

    def for_call(self, call: CallContext) -> BoundTool:
        """This tool for one call (the runtime binds every tool it runs, ``for_call``)."""
        return BoundTool(self, call)


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
        )

    return make if fn is None else make(fn)


# --- driving a contract tool --------------------------------------------------------------


@dataclass(frozen=True)
class CallContext:
    """What the runtime knows of a call when it binds a tool to it (before preflight)."""

    session_id: str
    operation_id: str
    attempt: int = 1
    loop: asyncio.AbstractEventLoop | None = None
    #: The key recorded with T1 (None: derived, ``idempotency_key``; the two agree by construction).
    idempotency_key: str | None = None


def result_of(value: Any, tool_name: str) -> ToolResult:
    """A tool's return value as a committed result: ``tool_result_invalid`` for one not JSON."""
    if isinstance(value, ToolResult):
        return value
    if isinstance(value, str):
        return ToolResult.text(value)
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", by_alias=True)
    try:
        canonical_json.dumps(value)
    except (MakaError, TypeError, ValueError) as exc:
        why = exc.message if isinstance(exc, MakaError) else str(exc)
        return ToolResult.error(
            "tool_result_invalid",
            f"{tool_name} returned a value that is not JSON: {why}",
            type=type(value).__name__,
        )
    return ToolResult.json(value)


def failed_result(exc: BaseException, tool_name: str) -> ToolResult:
    """What a raising tool commits: its refusal, or ``tool_failed`` with the exception's words."""
    if isinstance(exc, ToolRefusal):
        return exc.to_result()
    if isinstance(exc, MakaError):
        return ToolResult.error(exc.code, exc.message)
    return ToolResult.error(
        "tool_failed", f"{tool_name} raised {type(exc).__name__}: {exc}", error=type(exc).__name__
    )


def _resolve(
    value: Any, ctx: ToolContext, heartbeat: Callable[[], None] | None, timeout_s: float | None = None
) -> Any:
    """The value of a sync hook, or of an async one awaited on the worker's loop (heartbeating
    while it waits; a cancelled attempt cancels it). ``timeout_s``: a hook that runs before T1
    holds the ledger's thread while it is awaited, so it is cancelled past this bound
    (``HookTimedOut``) instead of stalling every other call's T1 and T2."""
    if not inspect.isawaitable(value):
        return value
    loop = ctx._loop
    if loop is None or loop.is_closed():
        try:
            return asyncio.run(asyncio.wait_for(_awaited(value), timeout_s))
        except TimeoutError:
            raise HookTimedOut(timeout_s) from None
    future = asyncio.run_coroutine_threadsafe(_awaited(value), loop)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        wait = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
        try:
            return future.result(timeout=wait)
        except concurrent.futures.TimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                future.cancel()
                raise HookTimedOut(timeout_s) from None
            if heartbeat is not None:
                try:
                    heartbeat()
                except BaseException:
                    future.cancel()
                    raise


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value


class HookTimedOut(ToolRefusal):
    """An async ``preflight`` or ``evidence`` hook did not answer within the tool's
    ``hook_timeout_s``: the call is refused before T1 (it never ran)."""

    def __init__(self, timeout_s: float | None) -> None:
        super().__init__(
            "tool_hook_timeout",
            f"a hook run before T1 did not answer within {timeout_s} s (the call did not run)",
            timeoutS=timeout_s,
        )


class BoundTool:
    """A contract tool bound to one call: the shape the runtime drives every tool through
    (``preflight``, ``capture_evidence``, ``run``, ``reconcile``, with the workspace)."""

    def __init__(self, tool: FunctionTool, call: CallContext) -> None:
        self.tool = tool
        self.call = call
        self.name = tool.name
        self.description = tool.description
        self.parameters = tool.parameters
        self.effects = tool.effects
        self.guarantee = tool.guarantee
        self.recovery_mode = tool.recovery_mode
        self.mutates = tool.mutates

    @property
    def idempotency_key(self) -> str:
        """The key every run of this call presents."""
        return self.call.idempotency_key or idempotency_key(self.call.session_id, self.call.operation_id)

    def context(self, ws: Workspace, heartbeat: Callable[[], None] | None = None) -> ToolContext:
        is_cancelled = _never
        if heartbeat is not None:
            beat = heartbeat

            def is_cancelled() -> bool:
                try:
                    beat()
                except Exception:
                    return True
                return False

        return ToolContext(
            tool_name=self.name,
            session_id=self.call.session_id,
            operation_id=self.call.operation_id,
            idempotency_key=self.idempotency_key,
            workspace_root=ws.root,
            attempt=self.call.attempt,
            guarantee=self.guarantee,
            _beat=heartbeat or _no_heartbeat,
            _is_cancelled=is_cancelled,
            _loop=self.call.loop,
        )

    def preflight(self, args: dict[str, Any], ws: Workspace) -> ToolResult | None:
        """Validate the arguments (``tool_args_invalid``), then the tool's own ``preflight``."""
        try:
            parsed = self.tool.parse_args(args)
            if self.tool.preflight_fn is not None:
                ctx = self.context(ws)
                _resolve(self.tool.preflight_fn(parsed, ctx), ctx, None, self.tool.hook_timeout_s)
        except ToolRefusal as exc:
            return exc.to_result()
        return None

    def capture_evidence(self, args: dict[str, Any], ws: Workspace) -> ToolEvidence | None:
        """The tool's evidence, a JSON object with a ``"schema"`` string, committed with T1.

        Raises:
            ToolRefusal: ``tool_evidence_invalid`` (before T1: the call never runs).
        """
        hook = self.tool.evidence_fn
        if hook is None:
            return None
        ctx = self.context(ws)
        try:
            value = _resolve(hook(self.tool.parse_args(args), ctx), ctx, None, self.tool.hook_timeout_s)
        except ToolRefusal:
            raise
        except Exception as exc:
            raise ToolRefusal("tool_evidence_invalid", f"{self.name}: evidence failed: {exc}") from None
        if value is None:
            return None
        schema = value.get("schema") if isinstance(value, dict) else None
        if not isinstance(schema, str) or not schema or schema.startswith("maka."):
            raise ToolRefusal(
                "tool_evidence_invalid",
                f'{self.name}: evidence is a JSON object with a "schema" string of its own (not maka.*)',
            )
        try:
            canonical_json.dumps(value)
        except MakaError as exc:
            raise ToolRefusal(
                "tool_evidence_invalid", f"{self.name}: evidence is not JSON: {exc.message}"
            ) from None
        return ToolEvidence(value)

    def run(self, args: dict[str, Any], ws: Workspace, heartbeat: Callable[[], None]) -> ToolResult:
        """Run the effect once; a raising tool is an error result (a cancellation propagates)."""
        ctx = self.context(ws, heartbeat)
        try:
            parsed = self.tool.parse_args(args)
            failpoints.hit("P3", tag=self.name)
            value = _resolve(self.tool.run_fn(parsed, ctx), ctx, heartbeat)
        except OutcomeUnknown:
            raise  # no outcome to commit: the operation stays dispatched without a response
        except Exception as exc:  # every other failure of a tool is its committed result
            if ctx.cancelled:
                heartbeat()  # raises: a cancelled attempt abandons its effect, whatever the tool raised
            return failed_result(exc, self.name)
        failpoints.hit("P4", tag=self.name)
        return enforce_result_limit(result_of(value, self.name), self.tool.result_byte_limit)

    def reconcile(self, args: dict[str, Any], ws: Workspace, evidence: JsonValue) -> Reconciliation | None:
        """Observe through the tool's ``reconcile`` hook; a raising hook saw nothing (unreadable)."""
        hook = self.tool.reconcile_fn
        if hook is None:
            return None
        ctx = self.context(ws)
        try:
            seen = _resolve(hook(self.tool.parse_args(args), evidence, ctx), ctx, None)
        except Exception as exc:
            seen = Reconciled.unreadable({"error": type(exc).__name__, "message": str(exc)})
        if not isinstance(seen, Reconciled):
            seen = Reconciled.unreadable({"error": "reconcile returned no Reconciled"})
        observed = {"observation": seen.observation, "observed": seen.observed}
        try:
            observation_digest = digest(canonical_json.dumps(observed))
        except MakaError:
            seen = Reconciled.unreadable()
            observed = {"observation": "unreadable", "observed": None}
            observation_digest = digest(canonical_json.dumps(observed))
        recovered = None
        if seen.observation == "matches_expected_state":
            recovered = enforce_result_limit(result_of(seen.result, self.name), self.tool.result_byte_limit)
        return Reconciliation(seen.observation, observation_digest, recovered, observed)


@dataclass(frozen=True)
class ToolEvidence:
    """A contract tool's own evidence (its JSON object), committed with T1 as it is."""

    value: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return self.value


def for_call(tool: Any, call: CallContext) -> Any:
    """``tool`` bound to one call when it is bound per call (a contract tool), else ``tool``."""
    bind = getattr(tool, "for_call", None)
    return tool if bind is None else bind(call)


def tool_catalog(tools: Mapping[str, Any]) -> dict[str, str]:
    """Every tool's name and the digest of its provider-facing argument schema."""
    return {name: schema_digest(t.parameters) for name, t in sorted(tools.items())}
