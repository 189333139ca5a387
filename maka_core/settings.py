"""One settings model for every ``maka`` process: environment ``MAKA_*`` first, command-line flags win.

``load_settings(**flags)`` validates everything at once and turns a bad value into one
``ConfigError("config_invalid")`` that names the setting (``MAKA_TOOL_HEARTBEAT_TIMEOUT`` ...), so a
command refuses before it starts or writes anything. A flag left unset (``None``) does not override
the environment. Drill-only switches (``MAKA_FAILPOINT*``, ``MAKA_EFFECT_LOG``) stay with the
modules that read them at import time: they are not configuration.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import ByteSize, Field, PositiveFloat, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from maka_core.errors import ConfigError
from maka_core.tools.bash_limits import (
    DEFAULT_FILE_BYTES,
    DEFAULT_MEMORY_BYTES,
    DEFAULT_PROCESSES,
    DEFAULT_TMP_BYTES,
    BashLimits,
    MiB,
)

if TYPE_CHECKING:
    from maka_core.runtime.runtime import RuntimeSettings

DEFAULT_TASK_QUEUE = "maka"
BASH_LIMIT_MINIMUM = {
    "bash_memory": 32 * MiB,
    "bash_processes": 8,
    "bash_tmp_size": MiB,
    "bash_file_size": MiB,
}
ENV_PREFIX = "MAKA_"


def _default_home() -> Path:
    return Path.home() / ".maka"


def _default_host() -> str:
    # The machine's name: one worker per machine serves that machine's workspaces by default.
    return socket.gethostname() or "localhost"


class MakaSettings(BaseSettings):
    """Every knob a maka process reads from its environment (``MAKA_<FIELD>``)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_ignore_empty=True, extra="ignore", frozen=True, case_sensitive=False
    )

    #: ``MAKA_HOME``: ledger, dev-server database and logs.
    home: Path = Field(default_factory=_default_home)
    #: ``MAKA_DB`` / ``--db``: a SQLite path or a SQLAlchemy URL; default ``$MAKA_HOME/ledger.sqlite``.
    db: str | None = None
    #: ``MAKA_TASK_QUEUE`` / ``--task-queue``: the queue shared by workers and session commands.
    task_queue: str = Field(default=DEFAULT_TASK_QUEUE, min_length=1)
    #: ``MAKA_HOST`` / ``--host``: the workspace host a worker serves and a new session is pinned
    #: to (its tool and recovery activities run only on that host's workers).
    host: str = Field(default_factory=_default_host, min_length=1, max_length=200, pattern=r"^[^\s@]+$")
    #: ``MAKA_HOST_WAIT``: seconds a session's host has to pick a tool or recovery activity up
    #: before the session parks with ``workspace_host_unavailable`` (read at session start and
    #: recorded with the session).
    host_wait: PositiveFloat = 120.0
    #: ``MAKA_METRICS_PORT`` / ``maka worker --metrics-port``: serve Prometheus ``/metrics`` there
    #: (0 picks a free port; unset, no endpoint).
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    #: ``MAKA_METRICS_HOST`` / ``maka worker --metrics-host``: the IP address ``/metrics`` binds.
    #: Loopback by default: the endpoint has no authentication, and a scraper in another pod or
    #: container must be let in explicitly (``0.0.0.0``, ``::``, or the pod's address).
    metrics_host: str = "127.0.0.1"
    #: ``MAKA_TOOL_HEARTBEAT_TIMEOUT`` / ``--tool-heartbeat-timeout``: seconds without a heartbeat
    #: before a tool attempt counts as dead.
    tool_heartbeat_timeout: PositiveFloat = 20.0
    #: ``MAKA_TOOL_START_TO_CLOSE_TIMEOUT``: the longest one tool attempt may run.
    tool_start_to_close_timeout: PositiveFloat = 900.0
    #: ``MAKA_MODEL_OUTPUT_MAX_BYTES``: the largest model step output (its text and every tool
    #: call's name and canonical arguments, UTF-8) a worker commits; a larger one fails the turn
    #: with ``model_output_too_large`` and nothing of it is committed (every later step replays it).
    model_output_max_bytes: int = Field(default=1_048_576, ge=1024, le=256 * 1024 * 1024)
    #: ``MAKA_POLICY``: tool policy JSON (validated here; ``maka_core.policy`` applies it).
    policy: str | None = None
    #: ``MAKA_PROVIDER_CALL_LOG``: test instrumentation, one line per real provider call.
    provider_call_log: str | None = None
    #: ``MAKA_WORKFLOW_TASK_TIMEOUT``: a new session's workflow task timeout (drills).
    workflow_task_timeout: PositiveFloat | None = None
    #: ``MAKA_STICKY_TIMEOUT``: how long a workflow task waits on a dead worker's sticky queue.
    sticky_timeout: PositiveFloat = 5.0
    #: ``MAKA_WAIT_TIMEOUT`` / ``--wait-timeout``: how long ``--wait`` waits for a turn to settle.
    wait_timeout: PositiveFloat = 600.0
    #: ``MAKA_RUNTIME_SAFE_BOUNDARY_RESUME``: ``1`` makes ``maka worker`` resume every eligible lost
    #: session after its startup repair; ``0`` disables resume altogether (``resume_feature_disabled``);
    #: unset, ``maka resume`` works and workers do not resume on their own.
    runtime_safe_boundary_resume: bool | None = None
    #: ``MAKA_BASH_NETWORK`` / ``maka worker --bash-network``: the operator's key to the network for
    #: bash; a call has it only when its session's policy also sets ``allowNetwork``.
    bash_network: bool = False
    #: ``MAKA_TOOLS`` (comma-separated) / ``maka worker --tools MODULE[:ATTR]`` (repeatable): the
    #: worker's own tools besides the built-ins (``maka_core.tools.loader``).
    tools: Annotated[tuple[str, ...], NoDecode] = ()
    #: ``MAKA_BASH_MEMORY``: memory of one bash call, all its processes and its ``/tmp`` together
    #: (bytes, or with a unit: ``512MiB``, ``2GiB``); ``0``: unbounded. See ``tools.bash_limits``.
    bash_memory: ByteSize = ByteSize(DEFAULT_MEMORY_BYTES)
    #: ``MAKA_BASH_PROCESSES``: processes (and threads) one bash call may have at once; ``0``: unbounded.
    bash_processes: int = Field(default=DEFAULT_PROCESSES, ge=0)
    #: ``MAKA_BASH_TMP_SIZE``: size of a bash call's private, RAM-backed ``/tmp``; ``0``: no size of
    #: its own (the kernel's tmpfs default, within the memory limit).
    bash_tmp_size: ByteSize = ByteSize(DEFAULT_TMP_BYTES)
    #: ``MAKA_BASH_FILE_SIZE``: the largest file a bash call may write; ``0``: unbounded.
    bash_file_size: ByteSize = ByteSize(DEFAULT_FILE_BYTES)
    #: ``MAKA_MCP_CONFIG`` / ``maka worker --mcp-config``: the MCP servers file (``mcpServers``,
    #: ``maka_core.tools.mcp.config``), parsed when a worker's runtime settings are made.
    mcp_config: Path | None = None
    #: ``MAKA_AGENTS`` / ``maka worker --agents``: the agents file (``{"agents": ...}``,
    #: ``tools.subagent.load_agents``): sub-agents served beside the worker's tools.
    agents: Path | None = None

    @field_validator("tools", mode="before")
    @classmethod
    def _tool_entries(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("home", mode="after")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    @field_validator("metrics_host", mode="after")
    @classmethod
    def _ip_literal(cls, value: str) -> str:
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            raise ValueError("not an IP address (127.0.0.1, 0.0.0.0, ::1, ::)") from None

    @field_validator("policy", mode="after")
    @classmethod
    def _policy_parses(cls, value: str | None) -> str | None:
        if value:
            from maka_core.policy import Policy

            try:
                Policy.from_json(json.loads(value))
            except (ValueError, ConfigError) as exc:
                raise ValueError(f"not a valid policy: {exc}") from None
        return value

    @field_validator("bash_memory", "bash_processes", "bash_tmp_size", "bash_file_size", mode="after")
    @classmethod
    def _bash_limit_usable(cls, value: int, info: Any) -> int:
        # Below these, the sandbox itself (bwrap, its supervisor shell, bash) cannot start.
        least = BASH_LIMIT_MINIMUM[info.field_name]
        if 0 < value < least:
            raise ValueError(f"must be 0 (unbounded) or at least {least}")
        return value

    @property
    def bash_limits(self) -> BashLimits:
        """The resource limits of one bash call (``0`` settings are unbounded: ``None``)."""
        return BashLimits(
            memory_bytes=int(self.bash_memory) or None,
            processes=self.bash_processes or None,
            tmp_bytes=int(self.bash_tmp_size) or None,
            file_bytes=int(self.bash_file_size) or None,
        )

    @property
    def ledger(self) -> str | Path:
        """The ledger target: a URL string, or a path (default under ``home``)."""
        if self.db and "://" in self.db:
            return self.db
        return Path(self.db).expanduser() if self.db else self.home / "ledger.sqlite"

    def runtime_settings(self, *, unsafe_no_sandbox: bool = False) -> RuntimeSettings:
        """The worker runtime's knobs from this one model (the protected paths are the worker's)."""
        # Imported here, not at the top: every ``maka`` command loads the settings, and the runtime
        # (SQLAlchemy, the store, the tools) is ~0.3 s of start-up that only a worker needs.
        from maka_core.runtime.runtime import RuntimeSettings
        from maka_core.tools.mcp.config import load_mcp_config

        return RuntimeSettings(
            tool_heartbeat_timeout_s=self.tool_heartbeat_timeout,
            tool_start_to_close_timeout_s=self.tool_start_to_close_timeout,
            provider_call_log=self.provider_call_log,
            model_output_max_bytes=self.model_output_max_bytes,
            unsafe_no_sandbox=unsafe_no_sandbox,
            bash_network=self.bash_network,
            bash_limits=self.bash_limits,
            mcp_config=None if self.mcp_config is None else load_mcp_config(self.mcp_config),
        )


def env_name(field: str) -> str:
    """The environment variable of a settings field (``tool_heartbeat_timeout`` -> ``MAKA_TOOL_...``)."""
    return ENV_PREFIX + field.upper()


def load_settings(**flags: Any) -> MakaSettings:
    """The environment plus the flags that were given (``None`` means not given).

    Raises:
        ConfigError: ``config_invalid`` naming the first bad setting (``setting``) and its value.
    """
    given = {k: v for k, v in flags.items() if v is not None}
    try:
        return MakaSettings(**given)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "?"
        source = f"--{field.replace('_', '-')}" if field in given else env_name(field)
        raise ConfigError(
            "config_invalid",
            f"{source}: {err['msg']} (got {err.get('input')!r})",
            setting=env_name(field),
            source=source,
        ) from None
