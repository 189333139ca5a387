"""``maka demo``: a scripted session on a sample workspace, on the embedded dev server when no
Temporal server is reachable. The README's first command; it must work on a fresh machine."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from pathlib import Path

from maka_core.facts.printable import printable
from maka_core.providers import demo_script_path
from maka_core.runtime.session_view import operations, transcript_lines
from maka_core.settings import MakaSettings
from maka_temporal.workers.cli.base import WaitLine, print_json, run_async, say, say_text
from maka_temporal.workers.client.connect import connect, reachable, target_address
from maka_temporal.workers.client.ledger import open_ledger
from maka_temporal.workers.client.session_api import SessionClient
from maka_temporal.workers.host import devserver
from maka_temporal.workers.host.serve import serve

DEMO_MESSAGE = "Change the port in config.json from 3000 to 4000, then check it with bash."
#: How long the demo waits for its turn to settle.
DEMO_WAIT_S = 120.0


def make_demo_workspace(root: Path) -> Path:
    """A fresh sample workspace: ``config.json`` with ``"port": 3000``."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"name": "demo-service", "port": 3000}, indent=2) + "\n")
    (root / "README.md").write_text("A sample service whose port the demo agent changes.\n")
    return root


def run_demo(settings: MakaSettings, *, address: str | None, namespace: str | None, as_json: bool) -> int:
    """The demo end to end; returns its exit code (0 when the agent changed the port)."""
    home = settings.home
    db = settings.ledger
    open_ledger(db, create=True).close()
    t0 = time.monotonic()

    async def main() -> int:
        server = None
        nonlocal address
        if not await reachable(address, namespace, timeout=1.0):
            port = int(target_address(address).rsplit(":", 1)[1])
            where = target_address(address)
            say(f"maka demo: no Temporal server at {where}; starting the embedded dev server", err=True)
            server = devserver.start(
                port=port if not devserver._port_open(port) else None,
                ui=False,
                db_file=home / "temporal.db",
                log_path=home / "logs" / "temporal.log",
            )
            address = server.address
        try:
            client = await connect(address, namespace)
            # A private task queue: the in-process worker (with THIS ledger) hosts the demo session
            # even when another worker with another ledger polls the shared queue.
            queue = f"maka-demo-{uuid.uuid4().hex[:8]}"
            stop, ready = asyncio.Event(), asyncio.Event()
            worker_task = asyncio.create_task(
                serve(client, db, queue, stop=stop, ready=ready, repair=False, host=settings.host)
            )
            await ready.wait()
            workspace = make_demo_workspace(home / "demo-workspace")
            sessions = SessionClient(client, ledger=db, task_queue=queue)
            try:
                started = await sessions.start(
                    workspace=workspace, message=DEMO_MESSAGE, script=demo_script_path(), host=settings.host
                )
                session_id = started.session_id
                say(f"maka demo: session {session_id} on {target_address(address)}", err=True)
                with WaitLine() as line:
                    status = await sessions.wait(
                        session_id,
                        started.run_id,
                        timeout=DEMO_WAIT_S,
                        on_progress=lambda p: line.show(p.state, p.elapsed_s),
                    )
                    line.done(status.state)
            finally:
                stop.set()
                await worker_task
        finally:
            devserver.stop_quietly(server)
        with open_ledger(db, create=False) as store:
            events = store.events(session_id=session_id)
        ops = operations(events)
        config = (workspace / "config.json").read_text()
        ok = status.state == "idle" and '"port": 4000' in config and all(o.status == "completed" for o in ops)
        if as_json:
            print_json(
                {
                    "ok": ok,
                    "sessionId": session_id,
                    "state": status.state,
                    "seconds": round(time.monotonic() - t0, 2),
                    "operations": [o.to_json() for o in ops],
                    "config": json.loads(config),
                },
                indent=2,
            )
            return 0 if ok else 1
        say()
        say(f"Session {session_id}  ({status.state}, {time.monotonic() - t0:.1f}s)")
        say()
        for text in transcript_lines(events):
            say_text(text)
        say()
        say(
            "Tool calls and their ledger facts "
            "(T1 = dispatch before the effect, T2 = outcome before the model sees it):"
        )
        for o in ops:
            say(f"  {printable(o.tool_name):<10} op {o.operation_id}")
            say(f"      T1 dispatch  {o.dispatch_event_id}  canonicalArgsHash {o.canonical_args_hash}")
            say(f"      T2 outcome   {o.response_event_id}  ({o.status}{', error' if o.is_error else ''})")
        say()
        say_text(f"config.json now: {config.strip()}")
        say(f"Ledger: {db}   Inspect: maka session show {session_id}")
        return 0 if ok else 1

    return run_async(main())
