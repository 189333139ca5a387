"""Connecting to Temporal with the standard client settings and the pydantic data converter.

Settings come from ``temporalio.envconfig`` (the ``temporal.toml`` profile file and the
``TEMPORAL_*`` environment variables: ``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``,
``TEMPORAL_API_KEY``, TLS...), then explicit arguments win. Default: ``localhost:7233``, ``default``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfigProfile
from temporalio.service import RPCError, RPCStatusCode

from maka_core.errors import MakaError

DEFAULT_PORT = 7233
DEFAULT_ADDRESS = f"localhost:{DEFAULT_PORT}"
#: How long to keep asking a frontend that answers "not healthy yet": a server that has just opened
#: its port (``maka dev``, a restarted server) is still starting, not down. A refused connection is
#: not retried: nothing listens, and the caller should hear so at once.
STARTING_SERVER_WAIT_S = 30.0


def connect_config(address: str | None = None, namespace: str | None = None) -> dict[str, Any]:
    """The keyword arguments for ``Client.connect`` from the environment plus overrides."""
    profile = ClientConfigProfile.load()
    config: dict[str, Any] = dict(profile.to_client_connect_config())
    config.setdefault("target_host", DEFAULT_ADDRESS)
    if address:
        config["target_host"] = address
    if namespace:
        config["namespace"] = namespace
    return config


def target_address(address: str | None = None) -> str:
    return str(connect_config(address)["target_host"])


def address_port(address: str) -> int:
    """The port of a ``host:port`` address (``[v6]:port`` too); the frontend's default, 7233, when it
    names none. ``maka dev`` binds it when ``--port`` is not given, so that ``TEMPORAL_ADDRESS``
    means the same server to the dev server and to every client."""
    _, sep, tail = address.rpartition(":")
    if sep and tail.isdigit() and 0 < int(tail) < 65536 and not address.endswith("]"):
        return int(tail)
    return DEFAULT_PORT


async def connect(address: str | None = None, namespace: str | None = None, **kwargs: Any) -> Client:
    """A client using the pydantic data converter (every contract is a pydantic model)."""
    config = connect_config(address, namespace)
    target = config.pop("target_host")
    deadline = time.monotonic() + STARTING_SERVER_WAIT_S
    while True:
        try:
            return await Client.connect(target, data_converter=pydantic_data_converter, **config, **kwargs)
        except RuntimeError as exc:  # the SDK's bridge reports a refused or failed connection this way
            if "not healthy" in str(exc) and time.monotonic() < deadline:
                await asyncio.sleep(0.25)
                continue
            raise MakaError(
                "temporal_unavailable",
                f"no Temporal server answers at {target} "
                "(start one with `maka dev`, or set TEMPORAL_ADDRESS)",
                address=target,
                cause=str(exc),
            ) from None


def server_gone(exc: RPCError) -> bool:
    """True when an RPC failed because the server did not answer, not because it refused the
    request: a refused connection (``UNAVAILABLE``), no answer in time (``DEADLINE_EXCEEDED``), or a
    call cut by the server's death (``UNKNOWN`` "transport error", or ``CANCELLED``). Such a failure
    is ``temporal_unavailable``; every other status is the server's answer."""
    # A server killed under the call tears the call down ("operation was canceled": this client
    # cancelled nothing) or cuts its connection ("transport error").
    gone = (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED)
    return exc.status in gone or "transport error" in exc.message


async def reachable(address: str | None = None, namespace: str | None = None, timeout: float = 1.0) -> bool:
    """True when a Temporal frontend answers at the configured address within ``timeout``."""
    try:
        client = await asyncio.wait_for(connect(address, namespace), timeout)
        await asyncio.wait_for(client.service_client.check_health(), timeout)
        return True
    except Exception:
        return False
