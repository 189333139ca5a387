"""The provider spec: which model a session talks to, as one pydantic union tagged by ``kind``.

Declared once; the workflow input (``SessionInput.provider`` and the activity inputs that carry
it), the CLI's ``--model PROVIDER:NAME`` and the factory (``provider_from_spec``) all use it. It
is persisted data: it is written into Temporal histories and onto each run's user event
(``lost_run.SessionRecord``), so every spec recorded before this union existed (plain dicts)
decodes to a model whose JSON is that same dict.

A spec never carries a credential: keys and base URLs come from the worker's environment
(``OPENAI_API_KEY``/``OPENAI_BASE_URL``, ``ANTHROPIC_API_KEY``/``ANTHROPIC_BASE_URL``), so no key
can reach a history, a ledger row or a log through the session. An unknown field (``apiKey``) is
refused, never silently dropped.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

from maka_core.errors import ConfigError

ProviderKind = Literal["script", "openai", "anthropic"]
#: ``--model PROVIDER:NAME`` prefixes: the model-serving kinds (a script is ``--script FILE``).
MODEL_KINDS: Final[tuple[str, ...]] = ("openai", "anthropic")


class _Spec(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True
    )

    @model_serializer(mode="wrap")
    def _drop_nulls(self, handler: SerializerFunctionWrapHandler) -> Any:
        # A recorded spec names only what was set: absent stays absent, so old dicts round-trip.
        data = handler(self)
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data

    def to_json(self) -> dict[str, Any]:
        """The spec's JSON object, as histories and ledger rows hold it."""
        out: dict[str, Any] = self.model_dump(mode="json")
        return out


class ScriptSpec(_Spec):
    """A scripted provider: the steps inline, or the path of a script file (exactly one)."""

    kind: Literal["script"] = "script"
    steps: list[Any] | None = None
    path: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ScriptSpec:
        if (self.steps is None) == (self.path is None):
            raise ValueError("a script spec has exactly one of steps or path")
        return self


class OpenAISpec(_Spec):
    """An OpenAI-compatible chat-completions model (key and base URL from the environment)."""

    kind: Literal["openai"] = "openai"
    model: str = Field(min_length=1)
    #: The session's system prompt (``--system``): the request's first message, never a user event.
    system: str | None = None
    #: Sampling temperature (chat completions take 0..2); absent: the server's default.
    temperature: float | None = Field(default=None, ge=0, le=2)
    #: The bound on a step's output tokens, sent as ``max_completion_tokens``; absent: none sent.
    max_tokens: int | None = Field(default=None, gt=0)
    timeout_seconds: int | float | None = Field(default=None, gt=0)
    #: The model's context window in tokens (``--context-window``); absent: the known model's
    #: (``KNOWN_CONTEXT_WINDOWS``), else unknown (compaction only on the vendor's context-length error).
    context_window: int | None = Field(default=None, gt=0)
    #: Tokens kept free below the window (``--context-reserve``): the step's output and the
    #: estimate's error. Absent: a fifth of the window, or the step's max tokens if larger.
    context_reserve: int | None = Field(default=None, ge=0)
    #: Kept only so specs recorded before the environment became the one source keep decoding
    #: (and keep their endpoint); nothing in maka writes it, and a new spec should not.
    base_url: str | None = None


class AnthropicSpec(_Spec):
    """A Claude model on Anthropic's Messages API (key and base URL from the environment)."""

    kind: Literal["anthropic"] = "anthropic"
    model: str = Field(min_length=1)
    #: The session's system prompt (``--system``): the request's ``system``, never a message.
    system: str | None = None
    #: The Messages API requires a bound on output tokens (``DEFAULT_MAX_TOKENS`` when absent).
    max_tokens: int | None = Field(default=None, gt=0)
    timeout_seconds: int | float | None = Field(default=None, gt=0)
    #: The model's context window in tokens (``--context-window``); absent: the known model's
    #: (``KNOWN_CONTEXT_WINDOWS``), else unknown (compaction only on the vendor's context-length error).
    context_window: int | None = Field(default=None, gt=0)
    #: Tokens kept free below the window (``--context-reserve``): the step's output and the
    #: estimate's error. Absent: a fifth of the window, or the step's max tokens if larger.
    context_reserve: int | None = Field(default=None, ge=0)


ProviderSpec = Annotated[ScriptSpec | OpenAISpec | AnthropicSpec, Field(discriminator="kind")]
_ADAPTER: TypeAdapter[ScriptSpec | OpenAISpec | AnthropicSpec] = TypeAdapter(ProviderSpec)


class UnrecognizedSpec(RootModel[dict[str, Any]]):
    """A recorded JSON object that is no valid spec, kept verbatim.

    Before the union a workflow input took any object, and a bad one failed the model step with
    ``provider_spec_invalid``; such a history must keep replaying, and still fail there, not on
    decoding (a workflow task that cannot decode its input is stuck, not failed). Never written
    by maka: a new session's spec is checked first (``new_session_spec``)."""

    model_config = ConfigDict(frozen=True)

    def to_json(self) -> dict[str, Any]:
        return dict(self.root)


#: Context windows (tokens) of known models, by name prefix, longest prefix first: the default of
#: a spec's ``contextWindow``. A model not listed has none (its vendor's context-length error is
#: the only trigger of compaction).
KNOWN_CONTEXT_WINDOWS: Final[tuple[tuple[str, int], ...]] = (
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-5", 400_000),
    ("gpt-3.5-turbo", 16_385),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
    ("claude-", 200_000),
)


def context_window(spec: ScriptSpec | OpenAISpec | AnthropicSpec) -> int | None:
    """The spec's context window in tokens: its own, else the known model's, else ``None``."""
    if isinstance(spec, ScriptSpec):
        return None
    if spec.context_window is not None:
        return spec.context_window
    return next((size for prefix, size in KNOWN_CONTEXT_WINDOWS if spec.model.startswith(prefix)), None)


def context_budget(spec: ScriptSpec | OpenAISpec | AnthropicSpec) -> int | None:
    """The most tokens a step may send before the runtime compacts the history first: the window
    minus the reserve (``None``: the window is unknown, or the spec is a script)."""
    window = context_window(spec)
    if window is None or isinstance(spec, ScriptSpec):
        return None
    reserve = spec.context_reserve
    if reserve is None:
        reserve = max(window // 5, spec.max_tokens or 0)
    return max(window - reserve, 1)


#: What a workflow or activity input holds: a spec, or (histories only) an unrecognized object.
RecordedSpec = Annotated[ProviderSpec | UnrecognizedSpec, Field(union_mode="left_to_right")]


def parse_provider_spec(raw: Any) -> ScriptSpec | OpenAISpec | AnthropicSpec:
    """A spec from its JSON object (or a spec, returned as is; an ``UnrecognizedSpec`` is judged).

    Raises:
        ConfigError: ``provider_spec_invalid``, naming the first problem.
    """
    if isinstance(raw, ScriptSpec | OpenAISpec | AnthropicSpec):
        return raw
    if isinstance(raw, UnrecognizedSpec):
        raw = raw.to_json()
    if not isinstance(raw, dict):
        raise ConfigError("provider_spec_invalid", "a provider spec is a JSON object")
    try:
        return _ADAPTER.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "spec"
        raise ConfigError(
            "provider_spec_invalid", f"provider spec {where}: {first['msg']}", kind=str(raw.get("kind"))
        ) from None


def new_session_spec(raw: Any) -> ScriptSpec | OpenAISpec | AnthropicSpec:
    """The spec of a session being started now: ``parse_provider_spec``, and no ``baseUrl`` (a
    recorded spec keeps decoding with its own; a new session's endpoint is the worker's
    ``OPENAI_BASE_URL``, so no URL, with or without credentials in it, enters a history).

    Raises:
        ConfigError: ``provider_spec_invalid``.
    """
    spec = parse_provider_spec(raw)
    if isinstance(spec, OpenAISpec) and spec.base_url is not None:
        raise ConfigError(
            "provider_spec_invalid", "a new session's base URL comes from the worker's OPENAI_BASE_URL"
        )
    return spec


def model_spec(
    text: str,
    *,
    system: str | None = None,
    temperature: float | None = None,
    max_tokens: int | None = None,
    timeout_seconds: float | None = None,
    context_window: int | None = None,
    context_reserve: int | None = None,
) -> OpenAISpec | AnthropicSpec:
    """The spec of ``--model PROVIDER:NAME`` (``openai:gpt-4.1-mini``, ``anthropic:claude-sonnet-4-5``)
    with the model's parameters (``--system``, ``--temperature`` (openai only), ``--max-tokens``,
    ``--context-window``, ``--context-reserve``; the HTTP timeout of ``--step-timeout``).

    A bare name (no known ``PROVIDER:`` prefix) stays ``openai``, as ``--model`` always meant.

    Raises:
        ConfigError: ``config_invalid`` for an empty name or a parameter out of the vendor's range
            (``setting`` names it).
    """
    kind, sep, name = text.partition(":")
    if not sep or kind not in MODEL_KINDS:
        kind, name = "openai", text
    name = name.strip()
    if not name:
        raise ConfigError("config_invalid", "give --model PROVIDER:NAME (openai:... or anthropic:...)")
    if kind == "anthropic" and temperature is not None:
        # The Messages API of the anthropic SDK maka runs on takes no temperature: refused, not dropped.
        raise ConfigError(
            "config_invalid", "anthropic models take no --temperature", setting="temperature", kind=kind
        )
    if context_window is not None and context_reserve is not None and context_reserve >= context_window:
        raise ConfigError(
            "config_invalid",
            f"--context-reserve {context_reserve} leaves nothing of --context-window {context_window}",
            setting="context_reserve",
            kind=kind,
        )
    given = {
        "system": system,
        "temperature": temperature,
        "max_tokens": max_tokens,
        "context_window": context_window,
        "context_reserve": context_reserve,
    }
    params: dict[str, Any] = {"model": name, "timeout_seconds": timeout_seconds}
    params.update({k: v for k, v in given.items() if v is not None})
    try:
        if kind == "anthropic":
            return AnthropicSpec(**params)
        return OpenAISpec(**params)
    except ValidationError as exc:
        first = exc.errors()[0]
        setting = str(first["loc"][0]) if first["loc"] else "model"
        raise ConfigError(
            "config_invalid", f"{kind} {setting}: {first['msg']}", setting=setting, kind=kind
        ) from None
