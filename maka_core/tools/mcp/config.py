"""The MCP servers file (``maka worker --mcp-config FILE``, ``MAKA_MCP_CONFIG``).

The ``mcpServers`` convention MCP clients already share, parsed strictly into frozen models:

    {"mcpServers": {
        "notes": {"command": "python", "args": ["notes.py"], "env": {"TOKEN": "..."}, "cwd": "srv"},
        "search": {"url": "https://example.org/mcp", "headers": {"Authorization": "Bearer ..."}},
        "files": {"command": "mcp-fs", "args": ["${workspace}"], "scope": "session"}
    }}

A server has a ``command`` (stdio) or a ``url`` (Streamable HTTP); the ``type`` other clients write
(``stdio``, ``http``, ``streamable-http``) is accepted and must agree. Maka's own keys:
``scope: "session"`` (stdio only) starts the server per session, in its workspace, with
``${workspace}`` in ``args`` replaced by the workspace root, inside the bash sandbox
(``"network": true`` gives that sandbox the network; ``tools.mcp.launch``). What a server says about
its tools (its annotations) is a hint the worker records and shows, never acts on, unless the
operator vouches for the server: ``"trustAnnotations": true`` (``tools.mcp.guarantee``).
``guarantee`` (per server) and ``tools: {"<tool>": {"guarantee": ...}}`` (per tool) narrow what is
trusted; only ``"operatorTrust": true`` beside a tool's ``guarantee`` may widen it, and that trust
is recorded with the call.

``env`` and ``headers`` are secrets: they are kept as ``SecretStr`` (a repr, a log line or an
error shows ``**********``), and only the transport that starts or reaches the server reads them.

Any other shape refuses the whole file with ``mcp_config_invalid`` and the path of the offending
field (``mcpServers.notes.comand``), before a worker starts anything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SecretStr,
    StringConstraints,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from maka_core.errors import CodecError, ConfigError
from maka_core.facts import canonical_json

#: What an MCP tool's guarantee can be: a server has no reconciler for maka to call, so
#: ``reconciliation-required`` is not offered.
McpGuarantee = Literal["read-only", "provider-idempotent", "at-least-once", "at-most-once"]
Scope = Literal["worker", "session"]
WORKSPACE_VARIABLE = "${workspace}"

#: A server's name is a part of every tool name the model sees (``mcp__<server>__<tool>``):
#: letters, digits and ``-``, single ``_`` between them (``__`` separates the parts).
_SERVER_NAME = r"^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$"
ServerName = Annotated[str, StringConstraints(min_length=1, max_length=32, pattern=_SERVER_NAME)]
_NonEmpty = Annotated[str, StringConstraints(min_length=1)]


class McpModel(BaseModel):
    """Frozen, strict about keys, camelCase on the wire."""

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)


class ToolGuarantee(McpModel):
    """One tool's guarantee as the operator sets it."""

    guarantee: McpGuarantee
    #: The operator vouches for ``guarantee`` even where it is wider than the annotations allow.
    operator_trust: bool = False


class _Server(McpModel):
    guarantee: McpGuarantee | None = None
    tools: dict[_NonEmpty, ToolGuarantee] = Field(default_factory=dict)
    #: The operator vouches for what the server says about its tools (``readOnlyHint``...); without
    #: it every tool is ``at-most-once`` and a possibly destructive mutation, whatever it says.
    trust_annotations: bool = False


class StdioServer(_Server):
    """A server maka starts as a child process and talks to over stdin/stdout."""

    type: Literal["stdio"] | None = None
    command: _NonEmpty
    args: tuple[str, ...] = ()
    env: dict[_NonEmpty, SecretStr] = Field(default_factory=dict)
    cwd: str | None = None
    scope: Scope = "worker"
    #: A session-scoped server's sandbox has the network (``tools.mcp.launch``); none by default.
    network: bool = False

    @model_validator(mode="after")
    def _scoped(self) -> StdioServer:
        if self.scope == "session" and self.cwd is not None:
            raise ValueError("a session-scoped server runs in the session's workspace: drop cwd")
        if self.scope == "worker" and self.network:
            raise ValueError('"network" is for a session-scoped server (a worker-scoped one has no sandbox)')
        if self.scope == "worker" and any(WORKSPACE_VARIABLE in a for a in self.args):
            raise ValueError(f'{WORKSPACE_VARIABLE} is known only to a server with "scope": "session"')
        return self

    def args_for(self, workspace: Path | None) -> list[str]:
        """The command's arguments, ``${workspace}`` replaced by ``workspace`` (session scope)."""
        if workspace is None:
            return list(self.args)
        return [a.replace(WORKSPACE_VARIABLE, str(workspace)) for a in self.args]


class HttpServer(_Server):
    """A Streamable HTTP server maka reaches at ``url``."""

    type: Literal["http", "streamable-http", "streamableHttp"] | None = None
    url: Annotated[str, StringConstraints(pattern=r"^https?://[^\s]+$")]
    headers: dict[_NonEmpty, SecretStr] = Field(default_factory=dict)
    scope: Literal["worker"] = "worker"


def _kind(value: Any) -> str | None:
    if isinstance(value, BaseModel):
        return "stdio" if isinstance(value, StdioServer) else "http"
    if not isinstance(value, dict):
        return None
    declared = value.get("type")
    if declared == "stdio" or (declared is None and "command" in value):
        return "stdio"
    if declared in ("http", "streamable-http", "streamableHttp") or (declared is None and "url" in value):
        return "http"
    return None


Server = Annotated[
    Annotated[StdioServer, Tag("stdio")] | Annotated[HttpServer, Tag("http")],
    Discriminator(
        _kind,
        custom_error_type="mcp_server_kind",
        custom_error_message="a server has a command (stdio) or a url (Streamable HTTP)",
    ),
]


class McpConfig(McpModel):
    """The whole file: the servers by name."""

    mcp_servers: dict[ServerName, Server]

    @field_validator("mcp_servers", mode="after")
    @classmethod
    def _some(cls, value: Mapping[str, Any]) -> Mapping[str, Any]:
        if not value:
            raise ValueError("name at least one server")
        return value


_TAGS = frozenset({"stdio", "http"})


def _field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for index, part in enumerate(loc):
        if part in _TAGS and index >= 2 and loc[index - 2] == "mcpServers":
            continue  # pydantic names the union member it tried; that is not a field
        if part == "[key]":
            continue  # a bad key: the path up to it names it
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "$"


def parse_mcp_config(value: Any, *, source: str = "<mcp config>", base: Path | None = None) -> McpConfig:
    """Validate an already-parsed file; a relative ``cwd`` is taken from ``base`` (the file's folder).

    Raises:
        ConfigError: ``mcp_config_invalid`` with ``field`` (``mcpServers.notes.command``).
    """
    if not isinstance(value, dict):
        raise ConfigError(
            "mcp_config_invalid", f"{source}: the file is a JSON object", path=source, field="$"
        )
    try:
        text = canonical_json.dumps(value)
    except CodecError as exc:
        raise ConfigError("mcp_config_invalid", f"{source}: {exc.message}", path=source, field="$") from None
    try:
        # Strict, through JSON: "true" is not a boolean and 1 is not a string here.
        config = McpConfig.model_validate_json(text, strict=True, by_alias=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = _field_path(tuple(first["loc"]))
        raise ConfigError(
            "mcp_config_invalid", f"{source}: {where}: {first['msg']}", path=source, field=where
        ) from None
    if base is None:
        return config
    servers = {
        name: server.model_copy(update={"cwd": str(base / server.cwd)})
        if isinstance(server, StdioServer) and server.cwd is not None and not Path(server.cwd).is_absolute()
        else server
        for name, server in config.mcp_servers.items()
    }
    return config.model_copy(update={"mcp_servers": servers})


def load_mcp_config(path: str | Path) -> McpConfig:
    """Read and validate the file (UTF-8 JSON; duplicate keys refused).

    Raises:
        ConfigError: ``mcp_config_invalid`` for an unreadable, non-JSON or invalid file.
    """
    source = str(path)
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(
            "mcp_config_invalid", f"cannot read {source}: {exc.strerror}", path=source, field="$"
        ) from None
    try:
        value = canonical_json.loads(text)
    except CodecError as exc:
        raise ConfigError("mcp_config_invalid", f"{source}: {exc.message}", path=source, field="$") from None
    return parse_mcp_config(value, source=source, base=Path(path).resolve().parent)


def tool_name(server: str, tool: str) -> str:
    """The name the model calls a server's tool by."""
    return f"mcp__{server}__{tool}"


#: What a provider accepts as a function name; a server tool named otherwise is not offered.
OFFERABLE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
