"""A user's own Temporal project uses maka as a library (issue 19, items 1 and 2).

The project (a tmp dir, first on ``sys.path``) has its own ``workflows``, ``activities`` and
``workers`` packages, laid out like Temporal's samples: its worker (``python -m workers.main``, a
real process) runs its own workflow and activity with ``MakaPlugin`` on the client; its workflow
calls its own activity, then ``maka_temporal.workflow.run_session`` (a child session on the dev
server), and returns the session's result. The session is then read like any other: status from
``SessionClient``, ``maka audit`` agrees. A second run with a workspace that does not exist is
refused with the CLI's code before any session exists (no workflow, no policy in the ledger).

A crash drill: the project's worker is SIGKILLed inside the child session's write (after the write,
before its outcome); the next worker settles the call from its evidence and the parent gets its
result, with one write in the effect journal. Negative control: the next worker built with a
guard that lets a dispatched call run again writes twice.

Negative control of the layout: with the repository's root first on ``sys.path`` (what an install that claimed
the top-level names ``workflows`` and ``workers`` gave), the project's own ``workflows`` package is
shadowed by maka's and its worker cannot import its workflow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from maka_core.store.writer import LedgerStore
from tests.temporal_support import REPO, run_maka

pytestmark = [pytest.mark.temporal]

FILES = {
    "workflows/__init__.py": """
        from workflows.triage import Triage

        __all__ = ["Triage"]
    """,
    "workflows/triage.py": """
        from datetime import timedelta

        from temporalio import workflow

        with workflow.unsafe.imports_passed_through():
            from activities import ticket_title
            from maka_temporal.workflow import run_session


        @workflow.defn
        class Triage:
            @workflow.run
            async def run(self, ticket: int, workspace: str, script: str) -> dict:
                title = await workflow.execute_activity(
                    ticket_title, ticket, start_to_close_timeout=timedelta(seconds=10)
                )
                result = await run_session(f"Triage: {title}", workspace=workspace, script=script)
                return {"title": title, **result.model_dump()}
    """,
    "activities/__init__.py": """
        from temporalio import activity


        @activity.defn
        async def ticket_title(ticket: int) -> str:
            return f"ticket {ticket}: the build is red"
    """,
    "workers/__init__.py": "",
    "workers/main.py": """
        import asyncio
        import os
        import signal

        import activities
        import workflows
        from temporalio.client import Client
        from temporalio.worker import Worker

        from maka_temporal import MakaPlugin


        async def main() -> None:
            print("project workflows:", workflows.__file__, flush=True)
            plugin = MakaPlugin(on_event=lambda event, _: print("worker:", event, flush=True))
            # A plain SDK client: the plugin gives it the pydantic payload converter.
            client = await Client.connect(os.environ["TEMPORAL_ADDRESS"], plugins=[plugin])
            stop = asyncio.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):
                asyncio.get_running_loop().add_signal_handler(sig, stop.set)
            async with Worker(
                client,
                task_queue=os.environ["MAKA_TASK_QUEUE"],
                workflows=[workflows.Triage],
                activities=[activities.ticket_title],
            ):
                await stop.wait()


        asyncio.run(main())
    """,
    "workers/naive.py": """
        # The kill matrix's negative control, in the project: the same worker with a Resolver guard
        # that lets a dispatched call run again (what a runtime without a ledger does).
        import asyncio
        import os

        import activities
        import workflows
        from temporalio.client import Client
        from temporalio.worker import Worker

        from maka_core.policy import Policy
        from maka_core.runtime.runtime import ResolverGuard, Runtime
        from maka_temporal import MakaPlugin


        class NaiveRetryGuard(ResolverGuard):
            def may_dispatch(self, op):
                return op.status != "completed"

            def may_redispatch(self, op):
                return op.status != "completed"


        def naive(store, settings):
            return Runtime(store, policy=Policy.from_env(), settings=settings, guard=NaiveRetryGuard())


        async def main() -> None:
            say = lambda event, _: print("worker:", event, flush=True)  # noqa: E731
            plugin = MakaPlugin(make_runtime=naive, on_event=say)
            client = await Client.connect(os.environ["TEMPORAL_ADDRESS"], plugins=[plugin])
            queue = os.environ["MAKA_TASK_QUEUE"]
            flows, acts = [workflows.Triage], [activities.ticket_title]
            async with Worker(client, task_queue=queue, workflows=flows, activities=acts):
                await asyncio.Event().wait()


        asyncio.run(main())
    """,
    "workers/start.py": """
        import asyncio
        import json
        import os
        import sys
        import uuid

        from temporalio.client import WorkflowFailureError
        from workflows import Triage

        from maka_temporal import SessionClient, connect


        async def main(workspace: str, script: str) -> None:
            client = await connect()
            queue = os.environ["MAKA_TASK_QUEUE"]
            run = dict(task_queue=queue, id=f"triage-{uuid.uuid4().hex[:8]}")
            result = await client.execute_workflow(Triage.run, args=[7, workspace, script], **run)
            status = await SessionClient(client, task_queue=queue).status(result["session_id"])
            print(json.dumps({"result": result, "status": status.state, "turns": len(status.turns)}))
            try:
                run["id"] = f"triage-{uuid.uuid4().hex[:8]}"
                await client.execute_workflow(Triage.run, args=[8, workspace + "-missing", script], **run)
            except WorkflowFailureError as err:
                print(json.dumps({"refused": err.cause.type}))


        asyncio.run(main(sys.argv[1], sys.argv[2]))
        sys.stdout.flush()
        os._exit(0)  # no interpreter finalization under the SDK's core threads (sdk-python issue 300)
    """,
}


def _project(root: Path) -> Path:
    for name, text in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return root


def _env(server: Any, home: Path, queue: str, path: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKA_", "TEMPORAL_"))}
    env.update(
        {
            "MAKA_HOME": str(home),
            "TEMPORAL_ADDRESS": server.address,
            "MAKA_TASK_QUEUE": queue,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": path,
        }
    )
    return env


def test_a_project_with_its_own_workflows_package_runs_a_maka_session(
    temporal_server: Any, tmp_path: Path
) -> None:
    project = _project(tmp_path / "proj")
    ws = tmp_path / "ws"
    ws.mkdir()
    script = tmp_path / "script.json"
    write = {"name": "write_file", "args": {"path": "TRIAGE.md", "content": "flaky test\n"}}
    script.write_text(json.dumps({"steps": [{"toolCalls": [write]}, {"text": "Triaged: a flaky test."}]}))
    home = tmp_path / "home"
    env = _env(temporal_server, home, f"proj-{tmp_path.name}"[:60], str(project))
    log = tmp_path / "worker.log"
    with open(log, "wb") as fh:
        worker = subprocess.Popen(
            [sys.executable, "-m", "workers.main"], cwd=project, env=env, stdout=fh, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while "worker: serving" not in log.read_text():
            assert worker.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert f"project workflows: {project / 'workflows' / '__init__.py'}" in log.read_text()
        started = subprocess.run(
            [sys.executable, "-m", "workers.start", str(ws), str(script)],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        worker.terminate()
        worker.wait(20)
    assert started.returncode == 0, started.stdout + started.stderr + log.read_text()
    ran, refused = (json.loads(line) for line in started.stdout.splitlines())
    result = ran["result"]
    assert result["title"] == "ticket 7: the build is red"
    assert (result["state"], result["park_reason"], result["text"]) == (
        "idle",
        None,
        "Triaged: a flaky test.",
    )
    assert ran["status"] == "idle" and ran["turns"] == 1, ran
    assert (ws / "TRIAGE.md").read_text() == "flaky test\n"
    # The child is a session like any other: the ledger holds its policy, and the audit agrees.
    audited = run_maka("audit", result["session_id"], "--json", env=env)
    assert audited.returncode == 0 and json.loads(audited.stdout)["ok"] is True, (
        audited.stdout + audited.stderr
    )
    # The refused run: the CLI's code, and nothing of a second session anywhere.
    assert refused == {"refused": "workspace_not_found"}
    with LedgerStore.open(home / "ledger.sqlite") as store:
        assert store.sessions() == [result["session_id"]]
        assert store.session_policy(result["session_id"]) is not None


def test_negative_control_the_repository_root_first_shadows_the_projects_workflows(tmp_path: Path) -> None:
    project = _project(tmp_path / "proj")
    probe = "import workflows; print(workflows.__file__); from workflows import Triage"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{project}"}
    shadowed = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert shadowed.stdout.startswith(str(REPO / "workflows")), shadowed.stdout
    assert shadowed.returncode != 0 and "cannot import name 'Triage'" in shadowed.stderr
    # The same probe with the project alone first finds the project's own package.
    env["PYTHONPATH"] = str(project)
    own = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert own.returncode == 0 and own.stdout.startswith(str(project / "workflows")), own.stdout + own.stderr


def test_the_public_face_loads_on_first_use() -> None:
    """``import maka_temporal`` loads neither the SDK nor the store (the workflow sandbox re-imports
    it for every run); each name of ``__all__`` resolves on first use. Negative control: using one
    loads them."""
    probe = (
        "import sys, maka_temporal\n"
        "big = {'temporalio', 'sqlalchemy', 'maka_core'}\n"
        "heavy = lambda: sorted({m.split('.')[0] for m in sys.modules} & big)\n"
        "print(heavy())\n"
        "missing = [n for n in maka_temporal.__all__ if getattr(maka_temporal, n, None) is None]\n"
        "print(missing, heavy())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.splitlines() == ["[]", "[] ['maka_core', 'sqlalchemy', 'temporalio']"], done.stdout


def _serving(proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while "worker: serving" not in log.read_text():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.parametrize("second", ["workers.main", "workers.naive"])
def test_a_child_session_whose_worker_dies_after_the_write_never_writes_twice(
    temporal_server: Any, tmp_path: Path, second: str
) -> None:
    """The project's worker is SIGKILLed inside the child session's ``write_file``, after the write
    and before its outcome (P4). A second worker settles the call from the evidence recorded with
    its dispatch, the child's turn ends and the parent gets the result: one write, in the effect
    journal. Negative control: the second worker built with a guard that lets a dispatched call
    run again (``workers.naive``) writes twice."""
    project = _project(tmp_path / "proj")
    ws = tmp_path / "ws"
    ws.mkdir()
    script = tmp_path / "script.json"
    write = {"name": "write_file", "args": {"path": "TRIAGE.md", "content": "flaky test\n"}}
    script.write_text(json.dumps({"steps": [{"toolCalls": [write]}, {"text": "Triaged."}]}))
    effects = tmp_path / "effects.jsonl"
    env = _env(temporal_server, tmp_path / "home", f"crash-{tmp_path.name}"[:60], str(project))
    env.update({"MAKA_EFFECT_LOG": str(effects), "MAKA_TOOL_HEARTBEAT_TIMEOUT": "2"})
    dying_env = {**env, "MAKA_FAILPOINT": "P4", "MAKA_FAILPOINT_TAG": "write_file"}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        log1, log2 = tmp_path / "w1.log", tmp_path / "w2.log"
        with open(log1, "wb") as fh:
            dying = subprocess.Popen(
                [sys.executable, "-m", "workers.main"],
                cwd=project,
                env=dying_env,
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        procs.append(dying)
        _serving(dying, log1)
        starter = subprocess.Popen(
            [sys.executable, "-m", "workers.start", str(ws), str(script)],
            cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert dying.wait(90) == -9, log1.read_text()  # SIGKILLed at P4, after the write landed
        assert len(effects.read_text().splitlines()) == 1
        with open(log2, "wb") as fh:
            worker = subprocess.Popen(
                [sys.executable, "-m", second], cwd=project, env=env, stdout=fh, stderr=subprocess.STDOUT
            )
        procs.append(worker)
        out, err = starter.communicate(timeout=180)
        assert starter.returncode == 0, out + err + log2.read_text()
    finally:
        for proc in procs:
            _stop(proc)
    result = json.loads(out.splitlines()[0])["result"]
    writes = [json.loads(line) for line in effects.read_text().splitlines()]
    assert all(w["path"] == str(ws / "TRIAGE.md") for w in writes)
    if second == "workers.main":
        assert (result["state"], result["text"]) == ("idle", "Triaged."), result
        assert len(writes) == 1, writes  # settled from the evidence: never written again
        audited = run_maka("audit", result["session_id"], "--json", env=env)
        assert audited.returncode == 0 and json.loads(audited.stdout)["ok"] is True, audited.stdout
    else:
        assert len(writes) == 2, writes  # the naive guard ran the dispatched call again
