"""``SessionClient.connect`` (eager, lazy, ledger-only when unreachable), ``wait``'s progress and
the CLI's ``send --wait`` and ``status`` answering through it.

The CLI commands are these calls (issue 19): ``session send --wait --json`` prints the object
``SessionClient.wait`` returns, which is ``session status --json``'s; ``session status`` with the
server down is ``SessionClient.connect(..., ledger_only_when_unreachable=True).status``.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel
from temporalio.client import Client
from temporalio.worker import Worker

from maka_core.tools import FunctionTool, ToolContext, tool
from maka_core.tools.beneath import MARKER_NAME
from maka_temporal import MakaPlugin, NewSession, SessionClient, SessionError, SessionStart, WaitProgress
from maka_temporal.workers.cli.app import maka
from maka_temporal.workers.client.session_client import ROUND_S
from maka_temporal.workers.host.devserver import free_port
from tests.temporal_support import tool_step, write_script


def _maka(args: list[str], env: dict[str, str]) -> Any:
    """The CLI in a thread of its own: a command runs its own event loop (``asyncio.run``)."""
    return CliRunner().invoke(maka, args, env=env, catch_exceptions=False)


def _dead() -> str:
    return f"127.0.0.1:{free_port()}"  # nothing listens there


@pytest.mark.asyncio(loop_scope="session")
async def test_connect_refuses_an_unreachable_server_unless_lazy_or_ledger_only(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite"
    with pytest.raises(SessionError) as err:
        await SessionClient.connect(_dead(), ledger=db, timeout=5)
    assert err.value.code == "temporal_unavailable"

    lazy = await SessionClient.connect(_dead(), ledger=db, timeout=5, lazy=True)
    assert lazy.client is None  # nothing tried yet
    with pytest.raises(SessionError) as err:
        await lazy.send("sess-x", "   ")
    assert err.value.code == "empty_message"  # the call's own refusal first, with no server
    with pytest.raises(SessionError) as err:
        await lazy.send("sess-x", "hello")
    assert err.value.code == "temporal_unavailable"  # control: past its checks, it connects

    offline = await SessionClient.connect(_dead(), ledger=db, timeout=5, ledger_only_when_unreachable=True)
    assert offline.client is None and offline.unreachable == "temporal_unavailable"
    with pytest.raises(SessionError) as err:
        await offline.status("sess-x")
    assert err.value.code == "ledger_not_found"  # the ledger answers: there is none at db


class _NapArgs(BaseModel):
    seconds: float


def _nap(args: _NapArgs, ctx: ToolContext) -> str:
    """Sleep a while (a long tool call)."""
    time.sleep(args.seconds)
    return "rested"


def _Nap() -> FunctionTool:
    made: FunctionTool = tool(_nap, name="nap", guarantee="read-only")
    return made


@pytest.mark.temporal
@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="session")
async def test_wait_reports_progress_and_the_cli_prints_the_status_object(
    temporal_client: Client,
    temporal_server: Any,
    tmp_path: Path,
    ws_dir: Path,
    task_queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A turn longer than one round of the long poll: ``wait`` hears its state (a listener that
    raises does not end the wait). Then the CLI's ``send --wait --json`` prints the same object as
    ``session status --json``, and ``status`` with the server unreachable answers from the ledger."""
    home = tmp_path / "home"
    monkeypatch.setenv("MAKA_HOME", str(home))
    db = tmp_path / "ledger.sqlite"
    nap = ROUND_S + 3
    script = write_script(
        tmp_path / "s.json",
        [tool_step(("nap", {"seconds": nap}), text="napping"), {"text": "done"}, {"text": "again"}],
    )
    sessions = SessionClient(temporal_client, ledger=db, task_queue=task_queue)
    heard: list[WaitProgress] = []

    def listener(progress: WaitProgress) -> None:
        heard.append(progress)
        raise RuntimeError("a broken listener")  # logged; the wait goes on

    plugin = MakaPlugin(ledger=db, tools=[_Nap()])
    async with Worker(temporal_client, task_queue=task_queue, plugins=[plugin]):
        started = await sessions.start(workspace=ws_dir, message="nap", script=script, session_id="wait-1")
        status = await sessions.wait("wait-1", started.run_id, timeout=120, on_progress=listener)
        assert (status.state, [o.tool_name for o in status.operations]) == ("idle", ["nap"]), status.raw
        assert heard, "no progress was reported over a turn longer than one round"
        assert {(p.session_id, p.run_id) for p in heard} == {("wait-1", started.run_id)}
        assert heard[0].state == "running" and heard[0].elapsed_s >= ROUND_S - 1, heard

        env = {"MAKA_HOME": str(home), "MAKA_TASK_QUEUE": task_queue, "MAKA_DB": str(db)}
        address = ["--address", temporal_server.address]
        sent = await asyncio.to_thread(
            _maka, ["session", "send", *address, "--wait", "--json", "wait-1", "again"], env
        )
        assert sent.exit_code == 0, sent.output
        after_send = json.loads(sent.stdout)
        shown = await asyncio.to_thread(_maka, ["session", "status", *address, "--json", "wait-1"], env)
        assert shown.exit_code == 0, shown.output
        status_json = json.loads(shown.stdout)
    assert set(after_send) == set(status_json) and "config" in after_send, (after_send, status_json)
    assert after_send["state"] == status_json["state"] == "idle"
    assert after_send["turns"] == status_json["turns"] and len(status_json["turns"]) == 2

    unreachable = ["session", "status", "--address", _dead(), "--json", "wait-1"]
    offline = await asyncio.to_thread(_maka, unreachable, env)
    assert offline.exit_code == 0, offline.output
    assert "workflow not reachable (temporal_unavailable); state from the ledger" in offline.stderr
    assert json.loads(offline.stdout)["turns"] == status_json["turns"]


def test_check_start_refuses_locally_and_start_with_writes_nothing_without_a_server(
    tmp_path: Path, ws_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``check_start`` is every local refusal of ``start`` (no client needed); ``start_with`` connects
    before it writes: with no server, no ledger and no workspace marker are left."""
    monkeypatch.setenv("MAKA_HOME", str(tmp_path / "home"))
    db = tmp_path / "ledger.sqlite"
    script = write_script(tmp_path / "s.json", [{"text": "hi"}])
    sessions = SessionClient(None, ledger=db)
    with pytest.raises(SessionError) as err:
        sessions.check_start(SessionStart.of(workspace=tmp_path / "nope", message="go", script=script))
    assert err.value.code == "workspace_not_found"
    new = sessions.check_start(SessionStart.of(workspace=ws_dir, message="go", script=script))
    assert isinstance(new, NewSession) and new.config.policy_digest and new.message == "go"
    with pytest.raises(SessionError) as err:
        asyncio.run(sessions.start_with(new))
    assert err.value.code == "temporal_unavailable"
    assert not db.exists() and not (ws_dir / MARKER_NAME).exists()
