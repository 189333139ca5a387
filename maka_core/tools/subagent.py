"""``SubAgent``: a tool whose effect is a child maka session (issue 31 item 3).

The model sees a sub-agent as the tool ``agent__NAME`` taking ``{"task": "..."}``. Its call is
admitted like any call (offer, policy, T1), but its effect is not run by the tool activity: the
session workflow starts a child session (``workflows.subagent``) whose first message is the task
and whose settled reply the call's T2 commits. The child's session id is derived from the parent's
session and operation ids (``child_session_id``), so a re-dispatch of the same call names the same
child: Temporal's workflow-id uniqueness is the idempotency key.

Declared settings that are not wired yet (``system``, ``workspace="isolated"``,
``max_turn_steps``) are refused when the sub-agent is made (``config_invalid``), never ignored.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from maka_core.errors import ConfigError, MakaError
from maka_core.tools.contract import FunctionTool

__all__ = [
    "AGENT_PREFIX",
    "DEFAULT_MAX_AGENT_DEPTH",
    "SubAgent",
    "SubAgentTask",
    "child_session_id",
    "is_subagent",
    "load_agents",
]

#: The prefix of every sub-agent's tool name (``agent__NAME``).
AGENT_PREFIX: Final = "agent__"
#: How deep sessions may nest (a session started by a user is depth 0): ``maxAgentDepth``.
DEFAULT_MAX_AGENT_DEPTH: Final = 2


class SubAgentTask(BaseModel):
    """The arguments the model gives a sub-agent."""

    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1, description="what the sub-agent is asked to do, in full")


def is_subagent(tool_name: str) -> bool:
    return tool_name.startswith(AGENT_PREFIX)


def child_session_id(parent_session_id: str, operation_id: str) -> str:
    """The child session of the call ``operation_id`` of ``parent_session_id``: the same call
    always names the same child (a valid session id, whatever the parent's length)."""
    digest = hashlib.sha256(f"{parent_session_id}\0{operation_id}".encode()).hexdigest()[:32]
    return f"agent-{digest}"


def _never_run(args: Any, ctx: Any) -> Any:
    # The session workflow dispatches a sub-agent's call as a child session; a tool activity that
    # reached here was handed a call it must not run (refused, never run as a plain tool).
    raise ConfigError("subagent_not_dispatchable", "a sub-agent's call runs as a child session only")


def _refuse(name: str, setting: str, message: str) -> ConfigError:
    return ConfigError("config_invalid", f"sub-agent {name}: {message}", setting=setting, tool=name)


class SubAgent(FunctionTool):
    """A sub-agent: ``SubAgent("researcher", "Finds facts", script="researcher.json")``.

    Args:
        name: the agent's name; the model sees the tool ``agent__NAME``.
        description: what the model is told the agent does.
        model: the child's model, as ``--model`` takes it (``openai:NAME``, ``anthropic:NAME``).
        script: the child's script file, as ``--script`` takes it. Neither: the parent's provider.
        system, max_turn_steps: not wired yet: refused (``config_invalid``) when given.
        workspace: ``"shared"`` (the parent's workspace; the only one wired yet).

    Raises:
        ConfigError: ``config_invalid`` (``setting``: the field).
    """

    def __init__(
        self,
        name: str,
        description: str,
        *,
        model: str | None = None,
        script: str | None = None,
        system: str | None = None,
        workspace: str = "shared",
        max_turn_steps: int | None = None,
    ) -> None:
        if model is not None and script is not None:
            raise _refuse(name, "model", "give either model or script")
        if system is not None:
            raise _refuse(name, "system", "system is not supported yet")
        if workspace != "shared":
            raise _refuse(name, "workspace", f"workspace {workspace!r} is not supported yet (only 'shared')")
        if max_turn_steps is not None:
            raise _refuse(name, "max_turn_steps", "max_turn_steps is not supported yet")
        super().__init__(
            name=f"{AGENT_PREFIX}{name}",
            run=_never_run,
            description=description,
            guarantee="at-most-once",
            args_model=SubAgentTask,
            parallel=True,
        )
        self.agent = name
        self.model = model
        self.script = script
        self.workspace = workspace


#: The keys an agent's entry in an agents file may hold.
_AGENT_KEYS: Final = frozenset({"description", "model", "script", "system", "workspace", "maxTurnSteps"})


def load_agents(path: str | Path) -> list[SubAgent]:
    """The sub-agents of an agents file (``maka worker --agents``, ``MAKA_AGENTS``), shaped like an
    MCP servers file: ``{"agents": {"NAME": {"description": ..., "model" | "script": ...}}}``. A
    relative ``script`` is relative to the file's folder.

    Raises:
        ConfigError: ``agents_config_invalid`` (``path``, and ``agent`` naming the entry).
    """
    file = Path(path)

    def bad(message: str, **detail: Any) -> ConfigError:
        return ConfigError("agents_config_invalid", f"{file}: {message}", path=str(file), **detail)

    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise bad(f"not a readable JSON file ({exc})") from None
    agents = raw.get("agents") if isinstance(raw, dict) else None
    if not isinstance(agents, dict) or set(raw) != {"agents"}:
        raise bad('expected {"agents": {"NAME": {...}}}')
    out = []
    for name, entry in agents.items():
        if not isinstance(entry, dict) or not set(entry) <= _AGENT_KEYS:
            raise bad(f"agent {name!r}: an object with keys among {sorted(_AGENT_KEYS)}", agent=name)
        if not isinstance(entry.get("description"), str):
            raise bad(f"agent {name!r}: description is a string", agent=name)
        script = entry.get("script")
        if isinstance(script, str) and not Path(script).is_absolute():
            script = str((file.parent / script).resolve())
        try:
            out.append(
                SubAgent(
                    name,
                    entry["description"],
                    model=entry.get("model"),
                    script=script,
                    system=entry.get("system"),
                    workspace=entry.get("workspace", "shared"),
                    max_turn_steps=entry.get("maxTurnSteps"),
                )
            )
        except MakaError as exc:
            raise bad(
                f"agent {name!r}: {exc.message}", agent=name, setting=exc.detail.get("setting")
            ) from None
    return out
