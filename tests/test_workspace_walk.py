"""The README's operator walk, run for real: a session parks, its Git workspace is edited while it
is parked, ``maka resume`` refuses with ``workspace_content_changed`` naming the paths, then
``--restore isolated`` continues in a restored folder beside it (the edited folder untouched) and
``--rebaseline`` continues from the edited files. Real dev server, real worker, the real CLI.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from maka_temporal.workflows.contracts import workflow_id_for
from tests.drills import Sandbox, maka_cli, ready, stop
from tests.temporal_support import tool_step, write_script

pytestmark = [pytest.mark.temporal, pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]


def git(root: Path, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env |= {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@x",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@x",
    }
    subprocess.run(["git", *args], cwd=root, env=env, check=True, capture_output=True)


async def maka(box: Sandbox, *args: str) -> tuple[int, str, str]:
    """``maka ARGS --db <ledger>`` as the operator types it: (exit code, stdout, stderr)."""
    env = {**os.environ, "MAKA_HOME": str(box.root), "TEMPORAL_ADDRESS": box.server.address}
    for key in ("MAKA_FAILPOINT", "MAKA_FAILPOINT_TAG", "MAKA_FAILPOINT_SKIP"):
        env.pop(key, None)
    proc = await asyncio.create_subprocess_exec(
        *maka_cli(), *args, "--db", str(box.db),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def parked_session(box: Sandbox, client: Any, ws: Path, name: str) -> str:
    """A session whose turn wrote notes.txt and parked (max_steps_exceeded); its execution ended."""
    ws.mkdir(exist_ok=True)
    git(ws, "init", "-q", "-b", "main")
    (ws / "src.py").write_text("print('v1')\n")
    git(ws, "add", ".")
    git(ws, "commit", "-qm", "init")
    script = write_script(
        box.root / f"{name}.json",
        [tool_step(("write_file", {"path": "notes.txt", "content": "by the model\n"})), {"text": "done"}],
    )
    code, out, err = await maka(
        box, "session", "start", "--workspace", str(ws), "--script", str(script),
        "--max-steps", "1", "--task-queue", box.queue, "--session-id", name, "--wait", "write the notes",
    )  # fmt: skip
    assert "parked" in out + err, (code, out, err)
    await client.get_workflow_handle(workflow_id_for(name)).terminate("operator: go on from the ledger")
    deadline = time.monotonic() + 60
    while (await client.get_workflow_handle(workflow_id_for(name)).describe()).status.name == "RUNNING":
        assert time.monotonic() < deadline, "the execution did not close"
        await asyncio.sleep(0.2)
    return name


async def test_the_readme_walk_restore_isolated_and_rebaseline(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    box = Sandbox(temporal_server, tmp_path / "walk")
    worker = box.worker()
    await ready(worker)
    try:
        ws = box.root / "proj"
        session = await parked_session(box, temporal_client, ws, "walk-restore")
        (ws / "src.py").write_text("print('edited while parked')\n")
        code, out, err = await maka(box, "resume", session)
        assert code == 1, (out, err)
        assert "parked (safety_check_failed): workspace_content_changed" in out, out
        assert "'changedPaths': {'modified': ['src.py']}" in out, out

        code, out, err = await maka(box, "resume", session, "--restore", "isolated", "--wait")
        assert code == 0, (out, err)
        restored = box.root / "proj.restored-1"
        assert f"restored checkpoint refs/maka/checkpoints/{session}/1 into {restored}" in err, err
        assert "continuing run" in out and "(state idle)" in out, out
        assert (restored / "src.py").read_text() == "print('v1')\n"
        assert (restored / "notes.txt").read_text() == "by the model\n"
        assert (ws / "src.py").read_text() == "print('edited while parked')\n"  # never written

        ws2 = box.root / "proj2"
        other = await parked_session(box, temporal_client, ws2, "walk-rebaseline")
        (ws2 / "src.py").write_text("print('edited while parked')\n")
        code, out, err = await maka(box, "resume", other, "--rebaseline", "--wait")
        assert code == 0, (out, err)
        assert (
            "rebaselined on the current files (workspace epoch 1, 1 changed path(s) named to the model)"
            in err
        )
        assert "(state idle)" in out, out
        code, out, _ = await maka(box, "audit", other)
        assert "rebaseline from refs/maka/checkpoints/walk-rebaseline/1 epoch 1  changed: src.py" in out, out
    finally:
        await stop(worker)


async def test_a_broken_on_progress_does_not_abort_a_resume_after_its_workspace_choice(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SessionClient.resume(rebaseline=True, on_progress=...)`` whose callback raises once the
    rebaseline committed: the resume goes on and continues the session (the error is logged)."""
    from maka_temporal import ResumeProgress, SessionClient

    box = Sandbox(temporal_server, tmp_path / "cb")
    monkeypatch.setenv("MAKA_HOME", str(box.root))
    worker = box.worker()
    await ready(worker)
    heard: list[ResumeProgress] = []

    def broken(step: ResumeProgress) -> None:
        heard.append(step)
        raise RuntimeError("the caller's callback is broken")

    try:
        ws = box.root / "proj"
        session = await parked_session(box, temporal_client, ws, "cb-rebaseline")
        (ws / "src.py").write_text("print('edited while parked')\n")
        sessions = SessionClient(temporal_client, ledger=box.db, task_queue=box.queue)
        done = await sessions.resume(session, rebaseline=True, wait=True, on_progress=broken)
        assert (done.decision, done.state) == ("continue", "idle"), done.raw
        assert [h.kind for h in heard][:1] == ["workspace"], heard
    finally:
        await stop(worker)
