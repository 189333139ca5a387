"""A planned stop also stops a model step (issue 37 item 10).

A vendor accepts the model request and never answers (``tests/held_vendor.py``, logging each
request's arrival); the real ``maka worker`` subprocess is sent SIGTERM while its step waits. The
stop is the tools' (``runtime.model_calls``): from the SIGTERM no provider request starts on that
worker, and the call in flight is cut at the worker's graceful timeout (5 s). So the worker exits
within the graceful timeout and a margin, the vendor sees no request from it after the SIGTERM, and
the next worker runs the step (nothing of it was committed) and the turn finishes idle. The audit
agrees with the histories (a local step gives up its workflow task: ``workflows.worker_stop``).

- ``local_held``: a local step (``with_tool``'s first step), ``--step-timeout 3600``;
- ``local_timeout_in_grace``: the same with a 3 s step timeout, shorter than the grace: the held
  call times out inside it and the step's retry, on the stopping worker, is refused before it sends;
- ``riding``: the step after a ``write_file`` rides in the call's (hybrid, local) tool activity, on
  Anthropic's wire: cut there, then refused as the workflow's own local step;
- ``activity``: a regular model-step activity (Temporal's own graceful cancel, and ours).

Negative control: the stop of ``1016e42`` (``tests/children/unstopped_model_worker.py``: the same
worker whose runtime ignores ``stop_model_calls``). With the 3600 s step the worker is still running
well past the graceful timeout (the wait is bounded here; the issue saw 3 minutes); with the 3 s
step the stopping worker retries the step and sends the vendor a new request after the SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from maka_core.runtime.session_view import transcript_lines
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.client.session_client import start_session
from maka_temporal.workers.host.worker import GRACEFUL_STOP
from tests.drills import maka_cli, ready, settle
from tests.held_vendor import ANSWER, HeldVendor
from tests.temporal_support import WorkerProcess

pytestmark = [
    pytest.mark.temporal,
    pytest.mark.crash,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="session"),
]

GRACE = GRACEFUL_STOP.total_seconds()
#: The stop's margin past the graceful timeout: the failed step's workflow task and the SDK's own
#: shutdown (measured ~0.2 s; generous for a loaded machine).
MARGIN = 7.0
UNSTOPPED = ("-m", "tests.children.unstopped_model_worker")

#: case -> (vendor, step mode, step timeout, the vendor's first answer a tool call, requests held)
CASES: dict[str, tuple[str, str, float, bool, tuple[int, ...]]] = {
    "local_held": ("openai", "with_tool", 3600, False, (1,)),
    "local_timeout_in_grace": ("openai", "with_tool", 3, False, (1,)),
    "riding": ("anthropic", "with_tool", 3600, True, (2,)),
    "activity": ("openai", "activity", 3600, False, (1,)),
}


def _env(vendor: HeldVendor) -> dict[str, str]:
    return {
        "OPENAI_BASE_URL": f"{vendor.url}/v1",
        "OPENAI_API_KEY": "sk-test",
        "ANTHROPIC_BASE_URL": vendor.url,
        "ANTHROPIC_API_KEY": "sk-ant-test",
    }


async def _until(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    ("case", "stop"),
    [*((case, "model_steps_stop") for case in CASES)]
    + [(case, "unstopped_1016e42") for case in ("local_held", "local_timeout_in_grace")],
)
async def test_sigterm_ends_a_held_model_step_within_the_graceful_timeout(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, case: str, stop: str
) -> None:
    vendor_kind, mode, step_timeout, tool_first, hold = CASES[case]
    vendor = HeldVendor(hold, tool_first=tool_first)
    db, home, queue = tmp_path / "ledger.sqlite", tmp_path / "home", f"stop-{case}-{tmp_path.name}"[-60:]
    entry = UNSTOPPED if stop == "unstopped_1016e42" else ("-m", "maka_temporal", "worker")
    first = WorkerProcess(
        temporal_server, db, queue, home=home, extra_env=_env(vendor), log=tmp_path / "first.log", entry=entry
    )
    second: WorkerProcess | None = None
    try:
        await ready(first)
        session_id, accepted = await start_session(
            temporal_client,
            workspace=ws_dir,
            provider={"kind": vendor_kind, "model": "m"},
            task_queue=queue,
            message="write the note",
            model_step_mode=mode,
            step_timeout_s=step_timeout,
        )
        await _until("the held request arrives", lambda: len(vendor.arrivals()) >= max(hold), 60)
        await asyncio.sleep(0.3)  # the request is held, not just arriving
        sigterm = time.time()
        first.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE + MARGIN
        while first.proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        exited = time.time() - sigterm if first.proc.poll() is not None else None
        after = [round(a - sigterm, 2) for a in vendor.arrivals() if a > sigterm]
        print(f"{case} {stop}: exited {exited} s after SIGTERM; requests after it at {after} s")

        if stop == "unstopped_1016e42":
            if case == "local_held":
                assert exited is None, f"the old stop exited after {exited} s"
            else:
                assert after, "the old stop's worker sent no request after the SIGTERM"
            return

        assert exited is not None, (
            f"still running {GRACE + MARGIN:.0f} s after SIGTERM:\n{first.log.read_text()}"
        )
        assert exited <= GRACE + MARGIN
        assert after == [], f"requests after the SIGTERM at {after} s"
        assert first.proc.returncode == 0, first.log.read_text()

        # The next worker runs the step; nothing of the stopped one was committed.
        before_second = len(vendor.arrivals())
        second = WorkerProcess(
            temporal_server, db, queue, home=home, extra_env=_env(vendor), log=tmp_path / "second.log"
        )
        await ready(second)
        status = await settle(temporal_client, session_id, accepted.run_id, timeout=90)
        assert status.state == "idle", status
        assert len(vendor.arrivals()) == before_second + 1, "the next worker asked the vendor once"
        store = LedgerStore.open(db)
        try:
            lines = transcript_lines(store.events(session_id=session_id))
        finally:
            store.close()
        assert f"model: {ANSWER}" in lines and "-- turn completed --" in lines, lines
        if tool_first:
            assert (ws_dir / "notes.txt").read_text() == "before the stop\n"
            assert sum(line.startswith("model -> write_file(") for line in lines) == 1, lines
        audit = await asyncio.to_thread(
            subprocess.run,
            [
                *maka_cli(),
                "audit",
                session_id,
                "--db",
                str(db),
                "--address",
                temporal_server.address,
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert audit.returncode == 0 and json.loads(audit.stdout)["ok"] is True, audit.stdout + audit.stderr
    finally:
        for worker in (first, second):
            if worker is not None and worker.proc.poll() is None:
                worker.proc.kill()
                worker.proc.wait()
        vendor.close()
