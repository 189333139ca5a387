"""Real Temporal for tests: the dev server through ``workers/host/devserver.py`` (the code path of
``maka dev``), in-process workers for speed, and ``maka worker`` as a real subprocess for crash drills.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from maka_core.runtime.runtime import RuntimeSettings
from maka_temporal.workers.client.connect import connect
from maka_temporal.workers.client.session_client import query_status, send_message, start_session
from maka_temporal.workers.host.devserver import DevServer
from maka_temporal.workers.host.serve import serve
from maka_temporal.workflows.contracts import SESSION_WORKFLOW
from maka_temporal.workflows.session import SessionWorkflow

REPO = Path(__file__).resolve().parents[1]


def run_maka(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``maka ARGS`` as a real process from the repository, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "maka_temporal", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write_script(path: Path, steps: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"steps": steps}))
    return path


def tool_step(*calls: tuple[str, dict[str, Any]], text: str | None = None) -> dict[str, Any]:
    step: dict[str, Any] = {"toolCalls": [{"name": n, "args": a} for n, a in calls]}
    if text is not None:
        step["text"] = text
    return step


@contextlib.asynccontextmanager
async def in_process_worker(
    client: Client,
    db: Path,
    queue: str,
    *,
    settings: RuntimeSettings | None = None,
    repair: bool = False,
    workflow: type | None = None,
    make_runtime: Any = None,
    replay: bool = True,
) -> AsyncIterator[None]:
    """A worker in this process (the same ``serve`` as ``maka worker``) until the block exits;
    ``workflow``: a test's variant of the session workflow, ``make_runtime`` of its runtime (a
    negative control). Once the block has exited cleanly, every session history of ``queue``
    must replay (``replays``); ``replay=False`` for a test whose histories are not one workflow's."""
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        serve(
            client,
            db,
            queue,
            settings=settings,
            stop=stop,
            ready=ready,
            repair=repair,
            out=io.StringIO(),
            workflow=workflow or SessionWorkflow,
            make_runtime=make_runtime,
        )
    )
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
    try:
        yield
    except BaseException:
        stop.set()
        await task
        raise
    stop.set()
    await task
    if replay:
        await replays(client, queue, workflow or SessionWorkflow)


async def replays(client: Client, queue: str, workflow: type) -> int:
    """Replay every session history the worker of ``queue`` wrote, against the workflow it ran: a
    worker restart or a cache eviction replays them so, and a nondeterminism fails the test here
    rather than a session's workflow tasks for ever (a patch asked after a local step did).
    Returns how many histories replayed."""
    replayer = Replayer(workflows=[workflow], data_converter=pydantic_data_converter)
    failures = []
    count = 0
    async for execution in client.list_workflows(f"TaskQueue = '{queue}'"):
        if execution.workflow_type != SESSION_WORKFLOW:
            continue
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        history = await handle.fetch_history()
        if not any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED for e in history.events):
            continue  # nothing decided yet (a run just continued as new): its replay would wait for ever
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        count += 1
        if result.replay_failure is not None:
            failures.append(f"{execution.id} run {execution.run_id}: {result.replay_failure}")
    assert not failures, "histories that do not replay:\n" + "\n".join(failures)
    return count


class WorkerProcess:
    """``maka worker`` as a real child process (SIGKILL-able), with its own env and flags."""

    def __init__(
        self,
        server: DevServer,
        db: Path | str,
        queue: str,
        *,
        home: Path,
        failpoint: str | None = None,
        failpoint_tag: str | None = None,
        heartbeat_timeout: float = 2.0,
        extra_env: dict[str, str] | None = None,
        log: Path | None = None,
        entry: tuple[str, ...] = ("-m", "maka_temporal", "worker"),
    ) -> None:
        """``entry``: the worker's command after the interpreter (a test may run its own build of the
        worker, e.g. ``tests.children.naive_worker``, with the same flags)."""
        env = dict(os.environ)
        env.update(
            {
                "MAKA_HOME": str(home),
                "TEMPORAL_ADDRESS": server.address,
                "MAKA_STICKY_TIMEOUT": "1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        for key in ("MAKA_FAILPOINT", "MAKA_FAILPOINT_TAG", "MAKA_FAILPOINT_SKIP"):
            env.pop(key, None)
        if failpoint:
            env["MAKA_FAILPOINT"] = failpoint
        if failpoint_tag:
            env["MAKA_FAILPOINT_TAG"] = failpoint_tag
        env.update(extra_env or {})
        self.log = log or home / f"worker-{uuid.uuid4().hex[:6]}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.log, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                *entry,
                "--db",
                str(db),
                "--task-queue",
                queue,
                "--tool-heartbeat-timeout",
                str(heartbeat_timeout),
            ],
            cwd=REPO,
            env=env,
            stdout=self._fh,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if b"polling task queue" in self.log.read_bytes():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited {self.proc.returncode}: {self.log.read_text()}")
            time.sleep(0.05)
        raise TimeoutError(f"worker not ready: {self.log.read_text()}")

    async def wait_exit(self, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError("worker did not exit (failpoint never hit?)\n" + self.log.read_text())
            await asyncio.sleep(0.05)
        self._fh.close()
        return self.proc.returncode

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._fh.close()

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def start(
    client: Client,
    workspace: Path,
    script: Path,
    queue: str,
    message: str = "go",
    **kwargs: Any,
) -> tuple[str, Any]:
    kwargs.setdefault("task_timeout", timedelta(seconds=3))
    # The drills pin activity mode's history shapes (scheduled tool activities); a hybrid drill
    # asks for ``tool_mode="hybrid"``. New sessions elsewhere start in NEW_SESSION_TOOL_MODE.
    kwargs.setdefault("tool_mode", "activity")
    return await start_session(
        client,
        workspace=workspace,
        provider={"kind": "script", "path": str(script)},
        task_queue=queue,
        message=message,
        **kwargs,
    )


async def wait_turn(client: Client, session_id: str, run_id: str, timeout: float = 60.0) -> Any:
    """The session status once turn ``run_id`` has settled."""
    deadline = time.monotonic() + timeout
    while True:
        status = await query_status(client, session_id)
        current = status.current_turn
        if (current is None or current.run_id != run_id) and status.state != "running":
            return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"turn {run_id} still {status.state}")
        await asyncio.sleep(0.05)


__all__ = [
    "WorkerProcess",
    "connect",
    "in_process_worker",
    "query_status",
    "send_message",
    "start",
    "tool_step",
    "wait_turn",
    "write_script",
]
