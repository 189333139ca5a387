"""A worker's ledger check at start meets a server that stopped answering (a restart between its
connect and the check, as the soak's ``server_restart`` fault found): the refusal is the CLI's
``temporal_unavailable``, exit 2, not an ``RPCError`` traceback. Control: any other RPC refusal is
not disguised as an unreachable server."""

from __future__ import annotations

import socket

import pytest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from maka_core.errors import MakaError
from maka_temporal.workers.host import devserver, ledger_guard


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
async def test_a_server_gone_at_the_ledger_check_is_temporal_unavailable() -> None:
    server = devserver.start()  # a real dev server of its own, connected to, then killed
    try:
        client = await Client.connect(server.address)
        assert await ledger_guard.queue_ledgers(client, "q") == {}  # it answers while it lives
    finally:
        server.kill()
    with pytest.raises(MakaError) as refused:
        await ledger_guard.queue_ledgers(client, "q")
    assert refused.value.code == "temporal_unavailable", refused.value


async def test_control_another_rpc_refusal_is_not_called_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    client = await Client.connect(f"127.0.0.1:{_free_port()}", lazy=True)

    async def denied(*_: object, **__: object) -> None:
        raise RPCError("permission denied", RPCStatusCode.PERMISSION_DENIED, b"")

    monkeypatch.setattr(client.workflow_service, "describe_task_queue", denied)
    with pytest.raises(RPCError):
        await ledger_guard.queue_ledgers(client, "q")
