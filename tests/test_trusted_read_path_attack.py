"""Issue 37.4 end to end: a program the model plants on the worker's PATH never runs as a trusted read.

A real ``maka worker`` started with a project's virtualenv activated (``PATH=WS/.venv/bin:$PATH``,
or a relative ``.venv/bin`` entry) serves a session whose policy trusts ``cat`` and ``ls``. The
model writes ``.venv/bin/cat`` (a script that logs a line to ``planted.log``, then runs the real
cat), makes it executable, and runs ``cat README``; the worker SIGKILLs itself at P4 of that call
(the line ran, T2 not committed) and a fresh worker recovers the session. Today the sandbox's PATH
holds no workspace folder, so ``cat`` is the system's: the planted program never runs, the line is
the read it looks like (recorded ``read-only``, re-read in recovery: the session goes on ``idle``).
Named by its path (``.venv/bin/cat README``), the program is the workspace's: the line is not a
read, runs once and parks. Negative control: workers with main's sandbox PATH and classifier
(``tests/children/verbatim_path_worker.py``) run the planted program twice, session ``idle``.
The workspace lives outside ``/tmp`` (the sandbox's own ``/tmp`` would hide a folder there).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from maka_core.governance import parse_policy
from maka_core.governance.policy_file import Identity, Principal
from maka_core.runtime.governed import SessionGovernance
from maka_core.runtime.session_view import operations
from maka_core.store.writer import LedgerStore
from tests.temporal_support import WorkerProcess, start, tool_step, wait_turn, write_script

pytestmark = [
    pytest.mark.temporal,
    pytest.mark.crash,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="session"),
]

TODAY = ("-m", "maka_temporal", "worker")
VERBATIM_PATH = ("-m", "tests.children.verbatim_path_worker")
README = "the real readme\n"
PLANT = '#!/bin/sh\necho ran >> planted.log\nexec /bin/cat "$@"\n'
POLICY = {
    "trustedReadCommands": ["ls", "cat"],
    "mutations": "allow",
    "defaultEvidence": {"bash": [{"type": "exit_code", "value": 0}]},
}


@pytest.fixture
def project() -> Iterator[Path]:
    base = Path("/var/tmp") if os.access("/var/tmp", os.W_OK) else Path.home()
    place = Path(tempfile.mkdtemp(prefix="maka-path-attack-", dir=base))
    root = place / "ws"
    root.mkdir()
    (root / "README").write_text(README)
    try:
        yield root
    finally:
        shutil.rmtree(place, ignore_errors=True)


def record_policy(db: Path, session_id: str) -> None:
    record = SessionGovernance(
        parse_policy(POLICY), Identity(principal=Principal.parse("agent:local"))
    ).to_record()
    with LedgerStore.open(db) as store:
        store.put_session_policy(
            session_id,
            policy=record["policy"],
            version=record["version"],
            digest=record["digest"],
            identity=record["identity"],
        )


async def planted_then_killed_at_p4(
    server: Any, client: Any, tmp_path: Path, ws: Path, queue: str, *, entry: str, line: str,
    worker: tuple[str, ...],
) -> tuple[Any, Any, str, dict[str, Any]]:  # fmt: skip
    """The reproduction: plant, chmod, ``line`` killed at P4, recovered by a fresh worker."""
    db = tmp_path / "ledger.sqlite"
    session_id = f"path-{uuid.uuid4().hex[:8]}"
    record_policy(db, session_id)
    script = write_script(
        tmp_path / "s.json",
        [
            tool_step(("write_file", {"path": ".venv/bin/cat", "content": PLANT})),
            tool_step(("bash", {"command": "chmod +x .venv/bin/cat"})),
            tool_step(("bash", {"command": line})),
            {"text": "ok"},
        ],
    )
    env = {"PATH": f"{entry}:{os.environ['PATH']}"}
    kw: dict[str, Any] = {"home": tmp_path, "entry": worker}
    armed = {**env, "MAKA_FAILPOINT_SKIP": "1"}  # the chmod passes P4; the read dies there
    with WorkerProcess(
        server, db, queue, failpoint="P4", failpoint_tag="bash", extra_env=armed, **kw
    ) as doomed:
        doomed.wait_ready()
        _, accepted = await start(client, ws, script, queue, session_id=session_id)
        assert await doomed.wait_exit() == -9, "the armed worker did not die at P4"
    with WorkerProcess(server, db, queue, extra_env=env, **kw) as fresh:
        fresh.wait_ready()
        status = await wait_turn(client, session_id, accepted.run_id, timeout=90)
    with LedgerStore.open(db) as store:
        assert store.verify() == []
        ops = operations(store.events(session_id=session_id))
        held = store.decision(ops[-1].operation_id)
        responses = [
            e.content.result
            for e in store.events(session_id=session_id)
            if e.content is not None and e.content.kind == "function_response"
        ]
    assert held is not None and len(ops) == 3, ops
    return (
        status,
        ops[-1],
        held["decision"]["executionGuarantee"],
        responses[-1] if len(responses) == 3 else {},
    )


def runs(ws: Path) -> int:
    log = ws / "planted.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.parametrize("spelling", ["venv", "relative"])
async def test_cat_readme_runs_the_systems_cat_and_is_reread_safely(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, project: Path, task_queue: str, spelling: str
) -> None:
    entry = str(project / ".venv" / "bin") if spelling == "venv" else ".venv/bin"
    status, op, guarantee, response = await planted_then_killed_at_p4(
        temporal_server, temporal_client, tmp_path, project, task_queue,
        entry=entry, line="cat README", worker=TODAY,
    )  # fmt: skip
    assert runs(project) == 0, "the planted cat ran"
    assert guarantee == "read-only"  # the system's cat: a read, re-read after the crash
    assert (status.state, op.status) == ("idle", "completed"), (status, op)
    assert response["value"]["stdout"] == README, response


async def test_the_planted_program_named_by_its_path_is_no_read_and_parks_after_one_run(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, project: Path, task_queue: str
) -> None:
    status, op, guarantee, _ = await planted_then_killed_at_p4(
        temporal_server, temporal_client, tmp_path, project, task_queue,
        entry=str(project / ".venv" / "bin"), line=".venv/bin/cat README", worker=TODAY,
    )  # fmt: skip
    assert runs(project) == 1
    assert guarantee == "at-most-once"
    assert (status.state, status.park_reason) == ("parked", "dispatch_without_response")
    assert (op.status, op.reason) == ("indeterminate", "dispatch_without_response")


async def test_negative_control_the_verbatim_path_runs_the_planted_cat_twice(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, project: Path, task_queue: str
) -> None:
    status, op, guarantee, _ = await planted_then_killed_at_p4(
        temporal_server, temporal_client, tmp_path, project, task_queue,
        entry=str(project / ".venv" / "bin"), line="cat README", worker=VERBATIM_PATH,
    )  # fmt: skip
    assert guarantee == "read-only"
    assert (status.state, op.status) == ("idle", "completed"), (status, op)
    assert runs(project) == 2  # judged a trusted read, the planted program ran twice
