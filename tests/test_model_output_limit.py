"""A model step's output is bounded (``MAKA_MODEL_OUTPUT_MAX_BYTES``): a larger one fails the turn
with ``model_output_too_large`` and nothing of it is committed (issue 23, 1.8).

Without the bound one 50 MB answer was one ledger row, read back and replayed to the provider by
every later step. Real SQLite files, the scripted provider through the runtime the activities call,
and a real session on a real dev server with a real ``maka worker``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest

from maka_core.errors import ConfigError
from maka_core.providers import ProviderError
from maka_core.runtime import model_step
from maka_core.runtime.contracts import ModelStepInput
from maka_core.runtime.runtime import Runtime, RuntimeSettings
from maka_core.settings import load_settings
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from tests.drills import maka_cli, ready, stop
from tests.temporal_support import WorkerProcess, write_script
from tests.test_continuation_runtime import IDS, SID, begin, provider, run

LIMIT = 4096
BIG_TEXT = {"text": "é" * LIMIT}  # 8 KiB of UTF-8: the bound counts bytes, not characters
BIG_ARGS = {"toolCalls": [{"name": "write_file", "args": {"path": "big.txt", "content": "x" * LIMIT}}]}


def _runtime(db: Path, limit: int) -> Runtime:
    return Runtime(LedgerStore.open(db), settings=RuntimeSettings(model_output_max_bytes=limit))


def _step(rt: Runtime, ws: Workspace, spec: dict[str, Any]) -> Any:
    return run(
        model_step.model_step(rt, ModelStepInput(ids=IDS, step=0, workspace=str(ws.root), provider=spec))
    )


def _largest_row(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return int(
            conn.execute("SELECT max(length(CAST(payload_json AS BLOB))) FROM runtime_events").fetchone()[0]
        )
    finally:
        conn.close()


@pytest.mark.parametrize("step", [BIG_TEXT, BIG_ARGS], ids=["text", "tool_args"])
def test_an_output_over_the_bound_is_refused_before_anything_is_committed(
    step: dict[str, Any], tmp_path: Path, ws: Workspace
) -> None:
    spec = provider(step)
    rt = _runtime(tmp_path / "bounded.sqlite", LIMIT)
    try:
        begin(rt, ws, spec=spec)
        before = rt.ledger.events(session_id=SID)
        with pytest.raises(ProviderError) as err:
            _step(rt, ws, spec)
        assert err.value.code == "model_output_too_large" and err.value.retryable is False
        assert err.value.detail["limit"] == LIMIT and err.value.detail["size"] > LIMIT
        assert rt.ledger.events(session_id=SID) == before  # nothing of the step committed
    finally:
        rt.close()
        rt.ledger.close()  # type: ignore[attr-defined]
    # Negative control: the unbounded step (today's behaviour, a bound above its size) commits
    # the whole output as one row.
    rt = _runtime(tmp_path / "unbounded.sqlite", 1 << 30)
    try:
        begin(rt, ws, spec=spec)
        _step(rt, ws, spec)
        committed = [e for e in rt.ledger.events(session_id=SID) if e.refs is not None and e.refs.step_id]
        assert committed
    finally:
        rt.close()
        rt.ledger.close()  # type: ignore[attr-defined]
    assert _largest_row(tmp_path / "unbounded.sqlite") > LIMIT


def test_an_output_at_the_bound_is_committed(tmp_path: Path, ws: Workspace) -> None:
    text = {"text": "a" * LIMIT}
    rt = _runtime(tmp_path / "l.sqlite", LIMIT)
    try:
        begin(rt, ws, spec=provider(text))
        assert _step(rt, ws, provider(text)).final
    finally:
        rt.close()
        rt.ledger.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("value", ["-5", "0", "1023", "abc", str(1 << 40)])
def test_the_setting_is_validated(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAKA_MODEL_OUTPUT_MAX_BYTES", value)
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert err.value.code == "config_invalid" and err.value.detail["setting"] == "MAKA_MODEL_OUTPUT_MAX_BYTES"


def test_the_default_bound_is_one_mebibyte_and_reaches_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MAKA_MODEL_OUTPUT_MAX_BYTES", raising=False)
    assert load_settings().runtime_settings().model_output_max_bytes == 1_048_576
    monkeypatch.setenv("MAKA_MODEL_OUTPUT_MAX_BYTES", "2048")
    assert load_settings().runtime_settings().model_output_max_bytes == 2048


SMALL_CALL = {"toolCalls": [{"name": "write_file", "args": {"path": "a.txt", "content": "A\n"}}]}


@pytest.mark.temporal
@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize(
    ("steps", "completed"),
    [([BIG_ARGS, {"text": "done"}], 0), ([SMALL_CALL, BIG_TEXT], 1)],
    ids=["first_step", "step_riding_with_a_tool"],
)
async def test_a_real_session_whose_model_answers_too_much_fails_the_turn_with_the_code(
    steps: list[dict[str, Any]], completed: int, temporal_server: Any, tmp_path: Path
) -> None:
    db, home, wsdir = tmp_path / "ledger.sqlite", tmp_path / "home", tmp_path / "ws"
    wsdir.mkdir()
    queue = f"limit-{uuid.uuid4().hex[:10]}"
    session_id = f"big-{queue}"
    script = write_script(tmp_path / "script.json", steps)
    worker = WorkerProcess(
        temporal_server, db, queue, home=home, extra_env={"MAKA_MODEL_OUTPUT_MAX_BYTES": str(LIMIT)}
    )
    env = {**os.environ, "MAKA_HOME": str(home), "TEMPORAL_ADDRESS": temporal_server.address}

    async def maka(*args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            *maka_cli(), *args, "--db", str(db),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        out, err = await proc.communicate()
        return proc.returncode or 0, out.decode(), err.decode()

    try:
        await ready(worker)
        code, out, err = await maka(
            "session", "start", "--workspace", str(wsdir), "--script", str(script),
            "--task-queue", queue, "--session-id", session_id, "--wait", "--json", "write it",
        )  # fmt: skip
        assert code == 1, (out, err)
        status = json.loads(out)
        assert status["state"] == "failed", status
        assert [op["status"] for op in status["operations"]] == ["completed"] * completed, status
        code, shown, _ = await maka("session", "show", session_id)
        assert code == 0 and "model_output_too_large" in shown, shown
        assert not (wsdir / "big.txt").exists()
        assert _largest_row(db) < LIMIT  # nothing oversized was committed
    finally:
        await stop(worker)
