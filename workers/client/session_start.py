"""A new session, checked once: what ``maka session start``, ``SessionClient.start`` and a child
session (``maka_temporal.workflow.run_session``) refuse, in one order, before anything is written
or started.

``new_session`` only reads (the script file, the policy file, the workspace folder); what a start
then writes is the session's policy in the ledger (``NewSession.record``) and the workspace marker
(``NewSession.session_input``), in that order, and only then does a workflow start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from maka_core.errors import ConfigError, MakaError
from maka_core.facts.bounds import USER_MESSAGE, check
from maka_core.facts.session_id import check_session_id
from maka_core.providers.scripted import ScriptedProvider
from maka_core.providers.spec import AnthropicSpec, OpenAISpec, ScriptSpec, model_spec, new_session_spec
from maka_core.runtime.contracts import (
    DEFAULT_MAX_PARALLEL_TOOLS,
    DEFAULT_MAX_STEPS_PER_TURN,
    DEFAULT_STEP_TIMEOUT_S,
    MAX_PARALLEL_TOOLS_BOUNDS,
    NEW_SESSION_TOOL_MODE,
    STEP_TIMEOUT_BOUNDS_S,
    ModelStepMode,
    SessionConfig,
    ToolMode,
)
from maka_core.settings import MakaSettings
from maka_core.store.engine import sqlite_file
from maka_core.tools.offer import parse_tool_set
from maka_core.workspace import Workspace, check_workspace_location
from maka_temporal.workers.client.ledger import ensure_utf8
from maka_temporal.workers.client.policy import SessionPolicy, session_policy
from maka_temporal.workflows.contracts import SessionInput

__all__ = [
    "MAX_SYSTEM_BYTES",
    "NewSession",
    "SessionStart",
    "check_message",
    "check_step_timeout",
    "new_session",
    "new_session_config",
    "provider_spec",
    "system_prompt",
]

#: The longest system prompt a session takes: the prompt rides in the provider spec, which every
#: model-step and tool activity input carries into the workflow's history.
MAX_SYSTEM_BYTES = 16 * 1024


def check_message(text: str) -> str:
    """A user message: valid UTF-8 and not blank (``message_invalid``, ``empty_message``), within
    the ``send_message`` Update's bound (``USER_MESSAGE``: ``message_invalid``)."""
    ensure_utf8(text, "message")
    if not text.strip():
        raise MakaError("empty_message", "the message is empty")
    check(USER_MESSAGE, text, "message")
    return text


def system_prompt(value: str | None) -> str | None:
    """``--system TEXT`` or ``--system @FILE`` (the file's UTF-8 text).

    Raises:
        ConfigError: ``system_file_unreadable`` (missing, unreadable or not UTF-8);
            ``config_invalid`` (empty, or longer than ``MAX_SYSTEM_BYTES``).
    """
    if value is None:
        return None
    text = ensure_utf8(value, "system_prompt")
    if value.startswith("@"):
        path = Path(value[1:]).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise ConfigError(
                "system_file_unreadable", f"cannot read the system prompt {path}: {why}", path=str(path)
            ) from None
    if not text.strip():
        raise ConfigError("config_invalid", "the system prompt is empty", setting="system")
    if len(text.encode("utf-8")) > MAX_SYSTEM_BYTES:
        raise ConfigError(
            "config_invalid", f"the system prompt is over {MAX_SYSTEM_BYTES} bytes", setting="system"
        )
    return text


def provider_spec(
    script: Path | None,
    model: str | None,
    *,
    system: str | None = None,
    temperature: float | None = None,
    max_tokens: int | None = None,
    step_timeout: float | None = None,
    context_window: int | None = None,
    context_reserve: int | None = None,
) -> ScriptSpec | OpenAISpec | AnthropicSpec:
    """The provider of a new session: a script (checked whole) or ``PROVIDER:NAME``."""
    if script is not None and model is not None:
        raise ConfigError("config_invalid", "give either --script or --model")
    if script is not None:
        given = [
            f
            for f, v in (
                ("--system", system),
                ("--temperature", temperature),
                ("--max-tokens", max_tokens),
                ("--context-window", context_window),
                ("--context-reserve", context_reserve),
            )
            if v is not None
        ]
        if given:
            # A script answers for the model: it has no prompt or sampling to set, and a setting
            # accepted and then dropped would be input lost.
            raise ConfigError(
                "config_invalid", f"{', '.join(given)} set a model (--model), not a script", setting=given[0]
            )
        try:
            ScriptedProvider.from_file(script)  # the whole script, before anything starts
        except RecursionError:
            raise ConfigError("script_invalid", f"{script} is nested too deeply", path=str(script)) from None
        return ScriptSpec(path=str(script.resolve()))
    if not model or not model.strip():
        raise ConfigError("config_invalid", "give --script FILE or --model PROVIDER:NAME")
    # The provider's HTTP timeout follows the step's own, so a long call is not cut short below it.
    return model_spec(
        model,
        system=system,
        temperature=temperature,
        max_tokens=max_tokens,
        timeout_seconds=step_timeout,
        context_window=context_window,
        context_reserve=context_reserve,
    )


def check_workspace(path: Path, s: MakaSettings) -> Path:
    """The codes ``Workspace.open`` uses, checked before the marker file is written: a workspace is a
    project folder, never /, a home or system folder, nor one holding MAKA_HOME or the ledger."""
    if not path.exists():
        raise ConfigError("workspace_not_found", f"no workspace at {path}", path=str(path))
    if not path.is_dir():
        raise ConfigError("invalid_workspace", f"{path} is not a directory", path=str(path))
    ledger = s.ledger
    check_workspace_location(
        path, maka_home=s.home, ledger_path=ledger if isinstance(ledger, Path) else sqlite_file(ledger)
    )
    return path


def check_step_timeout(seconds: float) -> float:
    """A new session's model-step timeout, within ``STEP_TIMEOUT_BOUNDS_S``.

    Raises:
        ConfigError: ``config_invalid`` (``setting`` = ``step_timeout_s``).
    """
    low, high = STEP_TIMEOUT_BOUNDS_S
    if not low <= seconds <= high:
        raise ConfigError(
            "config_invalid", f"the step timeout is {low:g}..{high:g} seconds", setting="step_timeout_s"
        )
    return seconds


def new_session_config(
    provider: Any,
    *,
    model_step_mode: str = "with_tool",
    step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
    max_steps_per_turn: int = DEFAULT_MAX_STEPS_PER_TURN,
    continue_as_new_after_turns: int | None = None,
    continue_as_new_after_steps: int | None = None,
    host: str | None = None,
    host_wait_s: float | None = None,
    tool_mode: str = NEW_SESSION_TOOL_MODE,
    max_parallel_tools: int = DEFAULT_MAX_PARALLEL_TOOLS,
    stream: bool | None = None,
) -> SessionConfig:
    """The config of a session being started now, every value checked (a recorded config is taken
    as it was written; this is where a new one enters). ``stream``: ``None`` streams a real
    provider's steps and not a script's.

    Raises:
        ConfigError: ``provider_spec_invalid``; ``config_invalid`` naming the setting.
    """
    spec = new_session_spec(provider)  # provider_spec_invalid before anything starts
    check_step_timeout(step_timeout_s)
    modes: tuple[ModelStepMode, ...] = get_args(ModelStepMode)  # the one declaration of the set
    if model_step_mode not in modes:
        raise ConfigError("config_invalid", f"model_step_mode is one of {modes}", setting="model_step_mode")
    for name, value in (
        ("max_steps_per_turn", max_steps_per_turn),
        ("continue_as_new_after_turns", continue_as_new_after_turns),
        ("continue_as_new_after_steps", continue_as_new_after_steps),
    ):
        if value is not None and value < 1:
            raise ConfigError("config_invalid", f"{name} is at least 1", setting=name)
    if host_wait_s is not None and host_wait_s <= 0:
        raise ConfigError("config_invalid", "the host wait is positive", setting="host_wait_s")
    tool_modes: tuple[ToolMode, ...] = get_args(ToolMode)
    if tool_mode not in tool_modes:
        raise ConfigError("config_invalid", f"tool_mode is one of {tool_modes}", setting="tool_mode")
    low, high = MAX_PARALLEL_TOOLS_BOUNDS
    if not low <= max_parallel_tools <= high:
        raise ConfigError(
            "config_invalid", f"max_parallel_tools is {low} to {high}", setting="max_parallel_tools"
        )
    return SessionConfig(
        tool_mode=tool_mode,
        max_parallel_tools=max_parallel_tools,
        stream=stream if stream is not None else spec.kind != "script",
        provider=spec,
        model_step_mode=model_step_mode,
        model_step_timeout_s=step_timeout_s,
        max_steps_per_turn=max_steps_per_turn,
        continue_as_new_after_turns=continue_as_new_after_turns,
        continue_as_new_after_steps=continue_as_new_after_steps,
        host=host,
        host_wait_s=host_wait_s if host else None,
    )


@dataclass(frozen=True)
class NewSession:
    """A session about to start, every input checked; nothing of it is written yet."""

    session_id: str
    message: str
    workspace: Path
    config: SessionConfig
    policy: SessionPolicy
    #: The provider as it was checked (``config.provider`` holds it too, as recorded).
    provider: ScriptSpec | OpenAISpec | AnthropicSpec

    def record(self, store: Any) -> bool:
        """The session's policy into the ledger, before its workflow exists (every worker then
        decides by it). Returns whether this call recorded it (``session_policy_conflict`` when the
        session already has another)."""
        return self.policy.record_to(store)

    def session_input(self, task_queue: str) -> SessionInput:
        """The workflow input; writes the workspace marker (``Workspace.open``)."""
        ws = Workspace.open(self.workspace, create=True)
        return SessionInput(
            session_id=self.session_id,
            workspace=str(ws.root),
            workspace_identity=ws.identity,
            task_queue=task_queue,
            config=self.config,
        )


class SessionStart(BaseModel):
    """A new session's settings as given, declared once: ``maka session start``'s options,
    ``SessionClient.start``'s keywords and a child session's inputs all build this, and
    ``new_session`` checks it (a value of the wrong type is ``config_invalid`` naming it, ``of``).
    The workspace host is no field: it is a setting (``MAKA_HOST``, ``--host``), read from ``s``."""

    # Strict: ``max_steps=True`` or ``"7"`` is ``config_invalid``, not 1 or 7 (an int is a float).
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    workspace: Path | str
    message: str
    script: Path | str | None = None
    model: str | None = None
    policy: Path | str | None = None
    session_id: str | None = None
    system: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    step_timeout: float = DEFAULT_STEP_TIMEOUT_S
    context_window: int | None = None
    context_reserve: int | None = None
    model_step_mode: str = "with_tool"
    max_steps: int = DEFAULT_MAX_STEPS_PER_TURN
    continue_as_new_after: int | None = None
    continue_as_new_after_steps: int | None = None
    principal: str | None = None
    # A list is a sequence as good as a tuple (its items stay strictly str).
    on_behalf_of: tuple[str, ...] = Field((), strict=False)
    unhinged: bool = False
    #: The tool set the model is offered (``tools.offer``); ``None``: every tool.
    offer: tuple[str, ...] | None = Field(None, strict=False)
    tool_mode: str = NEW_SESSION_TOOL_MODE
    #: Calls of one model step that run at once (1: one at a time).
    max_parallel_tools: int = DEFAULT_MAX_PARALLEL_TOOLS
    #: Stream each step's text into its partial snapshot; ``None``: on for a real provider, off
    #: for a script.
    stream: bool | None = None

    @classmethod
    def of(cls, **given: Any) -> SessionStart:
        """The settings, or ``config_invalid`` naming the first one of the wrong type.

        Raises:
            ConfigError: ``config_invalid`` (``setting``: the field).
        """
        try:
            return cls(**given)
        except ValidationError as exc:
            first = exc.errors()[0]
            name = str(first["loc"][0]) if first["loc"] else "settings"
            raise ConfigError("config_invalid", f"{name}: {first['msg']}", setting=name) from None


def new_session(s: MakaSettings, start: SessionStart) -> NewSession:
    """Check a new session's every input, in the CLI's order (message, id, step timeout, provider,
    settings, workspace, policy). ``s.host`` and ``s.host_wait`` pin it to a workspace host.

    Raises:
        MakaError: ``empty_message``, ``message_invalid``, ``session_id_invalid``,
            ``config_invalid`` (naming the setting), ``provider_spec_invalid``, ``script_invalid``,
            ``system_file_unreadable``, the workspace codes, ``policy_invalid``,
            ``unhinged_not_confirmed``, ``principal_invalid``; ``tool_set_invalid`` (``offer``:
            the tool set the session offers the model, ``tools.offer``).
    """
    text = check_message(start.message)
    if start.session_id is not None:
        check_session_id(start.session_id)
    step_timeout = start.step_timeout
    check_step_timeout(step_timeout)  # before it becomes the provider's HTTP timeout too
    spec = provider_spec(
        Path(start.script) if start.script is not None else None,
        start.model,
        system=system_prompt(start.system),
        temperature=start.temperature,
        max_tokens=start.max_tokens,
        step_timeout=step_timeout if step_timeout != DEFAULT_STEP_TIMEOUT_S else None,
        context_window=start.context_window,
        context_reserve=start.context_reserve,
    )
    config = new_session_config(
        spec,
        model_step_mode=start.model_step_mode,
        step_timeout_s=step_timeout,
        max_steps_per_turn=start.max_steps,
        continue_as_new_after_turns=start.continue_as_new_after,
        continue_as_new_after_steps=start.continue_as_new_after_steps,
        host=s.host,
        host_wait_s=s.host_wait,
        tool_mode=start.tool_mode,
        max_parallel_tools=start.max_parallel_tools,
        stream=start.stream,
    )
    path = check_workspace(Path(start.workspace), s)
    policy = Path(start.policy) if start.policy is not None else None
    governed = session_policy(
        s, start.session_id, policy, start.principal, start.on_behalf_of, start.unhinged
    )
    tool_set = parse_tool_set(start.offer) if start.offer is not None else None
    config = config.model_copy(update={"policy_digest": governed.record["digest"], "tool_set": tool_set})
    return NewSession(governed.session_id, text, path, config, governed, spec)
