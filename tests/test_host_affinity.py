"""Host affinity on Temporal: two ``maka worker`` processes, two hosts, one ledger, one dev server.

Each host has its own workspace root and its own effect journal (``MAKA_EFFECT_LOG``), so where a
tool ran is a fact on disk: a write by host ``a``'s worker of a path under host ``b``'s root is a
misrouted tool. Must hold: sessions pinned to a host run their tools only there; killing one host's
worker (SIGKILL in the middle of a ``write_file``, after its effect and before T2) parks that
host's sessions with ``workspace_host_unavailable`` (in the workflow and on the ledger's run
header) while the other host's sessions keep running; bringing the host back and ``maka resume``
finishes them with every effect exactly once. The negative control runs the same check against a
worker built (by this test) to send tools to the shared queue: the check must catch it.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from maka_core.store.writer import LedgerStore
from maka_temporal.workers.client.session_client import query_status
from maka_temporal.workflows.contracts import workflow_id_for
from tests.drills import HEARTBEAT_S, Kill, file_effects, log_lines, maka_cli, ready, stop, verify_ledger
from tests.pg_support import SKIP_REASON, fresh_pg_schema, pg_base_url
from tests.temporal_support import WorkerProcess, start, tool_step, write_script

pytestmark = [pytest.mark.temporal, pytest.mark.crash, pytest.mark.asyncio(loop_scope="session")]

#: Small in tests: how long a host has to start a tool before its sessions park.
HOST_WAIT_S = 3.0
BASH = "echo ran >> effects.log"
VARIANT_WORKER: tuple[str, ...] = ("-m", "tests.children.variant_worker", "--workflow")
UNPINNED_WORKER = (*VARIANT_WORKER, "tests.children.unpinned_workflow:UnpinnedSessionWorkflow")
HOSTLESS_LOCAL_WORKER = (*VARIANT_WORKER, "tests.children.hostless_local_workflow:HostlessLocalWorkflow")


@dataclass
class Host:
    name: str
    root: Path
    journal: Path


class Fleet:
    """One ledger, one queue, two hosts with their own workspace roots and effect journals."""

    def __init__(
        self, server: Any, root: Path, *, backend: str = "sqlite", tool_mode: str = "activity"
    ) -> None:
        self.server = server
        self.tool_mode = tool_mode
        self.root = root
        self._resources = ExitStack()
        self.db: Path | str = (
            root / "ledger.sqlite"
            if backend == "sqlite"
            else self._resources.enter_context(fresh_pg_schema())
        )
        self.queue = f"hosts-{uuid.uuid4().hex[:10]}"
        self.hosts = {n: Host(n, root / f"host-{n}", root / f"effects-{n}.jsonl") for n in ("a", "b")}
        for host in self.hosts.values():
            host.root.mkdir(parents=True, exist_ok=True)
        self._started = 0
        self.script = write_script(
            root / "script.json",
            [
                tool_step(("write_file", {"path": "a.txt", "content": "A\n"})),
                tool_step(("bash", {"command": BASH})),
                {"text": "done"},
            ],
        )

    def worker(
        self, host: str, kill: Kill | None = None, entry: tuple[str, ...] | None = None
    ) -> WorkerProcess:
        self._started += 1
        env = {"MAKA_HOST": host if entry else "", "MAKA_EFFECT_LOG": str(self.hosts[host].journal)}
        if kill is not None:
            env.update(kill.env())
        return WorkerProcess(
            self.server,
            self.db,  # type: ignore[arg-type]
            self.queue,
            home=self.root,
            failpoint=kill.failpoint if kill else None,
            failpoint_tag=kill.tag if kill else None,
            heartbeat_timeout=HEARTBEAT_S,
            extra_env=env,
            log=self.root / f"worker-{host}-{self._started}.log",
            # The real worker gets its host as an operator gives it: ``maka worker --host``.
            entry=entry or ("-m", "maka_temporal", "worker", "--host", host),
        )

    async def session(self, client: Any, host: str, label: str) -> str:
        ws = self.hosts[host].root / label
        ws.mkdir()
        session_id, _ = await start(
            client, ws, self.script, self.queue, session_id=f"{label}-{self.queue}", host=host,
            host_wait_s=HOST_WAIT_S, tool_mode=self.tool_mode,
        )  # fmt: skip
        return session_id

    def workspace(self, session_id: str) -> Path:
        label = session_id.removesuffix(f"-{self.queue}")
        return self.hosts[label.split("-")[0]].root / label

    def misplaced(self, host: str) -> list[str]:
        """Paths host ``host``'s worker wrote outside its own workspace root."""
        own = self.hosts[host].root.resolve()
        return sorted(
            p for (_, p) in file_effects(self.hosts[host].journal) if not Path(p).is_relative_to(own)
        )

    def writes(self, session_id: str) -> int:
        """Real writes of the session's ``a.txt``, by any host."""
        path = str((self.workspace(session_id) / "a.txt").resolve())
        return sum(file_effects(h.journal)[("write_file", path)] for h in self.hosts.values())

    def close(self) -> None:
        self._resources.close()


async def until(client: Any, session_id: str, state: str, *, timeout: float = 90.0) -> Any:
    """The session's status once it is ``state`` with no turn running (bounded; says what it saw)."""
    deadline = asyncio.get_running_loop().time() + timeout
    last: Any = None
    while asyncio.get_running_loop().time() < deadline:
        try:
            last = await asyncio.wait_for(query_status(client, session_id), 10)
            if last.state == state and (state == "parked" or last.current_turn is None):
                return last
        except Exception as exc:  # no worker to answer for a moment
            last = exc
        await asyncio.sleep(0.2)
    raise AssertionError(f"session {session_id} not {state} after {timeout:.0f}s; last seen: {last!r}")


async def maka(fleet: Fleet, *args: str, **extra: str) -> tuple[int, dict[str, Any], str]:
    """``maka ARGS --db <ledger> --json`` through the real CLI: (exit code, JSON, stderr)."""
    env = {**os.environ, "MAKA_HOME": str(fleet.root), "TEMPORAL_ADDRESS": fleet.server.address}
    for key in ("MAKA_FAILPOINT", "MAKA_FAILPOINT_TAG", "MAKA_FAILPOINT_SKIP", "MAKA_HOST"):
        env.pop(key, None)
    env.update(extra)
    proc = await asyncio.create_subprocess_exec(
        *maka_cli(), *args, "--db", str(fleet.db), "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await proc.communicate()
    try:
        doc = json.loads(out) if out.strip() else {}
    except ValueError:
        doc = {"raw": out.decode()}
    return proc.returncode or 0, doc, err.decode()


def header_park(fleet: Fleet, session_id: str) -> tuple[str, str | None]:
    with LedgerStore.open(fleet.db) as store:
        (run,) = store.list_runs(session_id=session_id)
        return run.status, run.park_reason


async def two_host_drill(
    server: Any, client: Any, root: Path, *, backend: str, per_host: int, tool_mode: str = "activity"
) -> None:
    """``tool_mode="hybrid"``: the same conclusions. A session's ``write_file`` runs locally where its
    workflow task runs on its own host's worker and defers (``off_host``) to the host queue where it
    does not; host a's worker dying in a local write loses that task, and the replay on host b
    defers, waits on the host queue and parks, as a regular call does."""
    fleet = Fleet(server, root, backend=backend, tool_mode=tool_mode)
    # Host a's worker dies in its first write of the second wave: effect done, T2 not committed.
    a = fleet.worker("a", Kill("P4", tag="write_file", skip=per_host))
    b = fleet.worker("b")
    workers = [a, b]
    try:
        await asyncio.gather(ready(a), ready(b))
        first = await asyncio.gather(
            *(fleet.session(client, h, f"{h}-first{i}") for h in ("a", "b") for i in range(per_host))
        )
        await asyncio.gather(*(until(client, s, "idle") for s in first))
        assert fleet.misplaced("a") == [] and fleet.misplaced("b") == [], "a tool ran off its host"
        assert [fleet.writes(s) for s in first] == [1] * len(first)

        second_a = [await fleet.session(client, "a", "a-second0")]
        assert await a.wait_exit(60) != 0, "host a's worker should have died in its write"
        second_a += await asyncio.gather(
            *(fleet.session(client, "a", f"a-second{i}") for i in range(1, per_host))
        )
        second_b = await asyncio.gather(
            *(fleet.session(client, "b", f"b-second{i}") for i in range(per_host))
        )
        await asyncio.gather(*(until(client, s, "idle") for s in second_b))
        parked = await asyncio.gather(*(until(client, s, "parked") for s in second_a))
        assert {(p.park_reason, p.host) for p in parked} == {("workspace_host_unavailable", "a")}, parked
        for s in second_a:
            assert header_park(fleet, s) == ("parked", "workspace_host_unavailable")
        assert fleet.misplaced("b") == [], "host b ran a tool of host a's sessions"
        code, status, err = await maka(fleet, "session", "status", second_a[0])
        assert (status.get("state"), status.get("parkReason"), status.get("host")) == (
            "parked", "workspace_host_unavailable", "a",
        ), (code, status, err)  # fmt: skip

        # Resumed while its host is still away: it waits on the host queue again and parks again.
        code, out, err = await maka(fleet, "resume", second_a[0], "--wait")
        assert (code, out.get("state"), out.get("parkReason")) == (
            1, "parked", "workspace_host_unavailable",
        ), (code, out, err)  # fmt: skip
        assert fleet.misplaced("b") == [] and fleet.writes(second_a[0]) == 1

        a = fleet.worker("a")  # the host comes back
        workers.append(a)
        await ready(a)
        resumed = await asyncio.gather(*(maka(fleet, "resume", s, "--wait") for s in second_a))
        for code, out, err in resumed:
            assert code == 0 and out.get("state") == "idle" and out.get("host") == "a", (code, out, err)
            assert out.get("hostResumed") is True and out["decision"] == "continue", out  # in place
        everyone = [*first, *second_a, *second_b]
        assert fleet.misplaced("a") == [] and fleet.misplaced("b") == []
        assert {s: fleet.writes(s) for s in everyone} == {s: 1 for s in everyone}, "a write ran twice"
        assert {s: log_lines(fleet.workspace(s) / "effects.log")["ran"] for s in everyone} == {
            s: 1 for s in everyone
        }, "a bash ran twice"
        clean, text = await verify_ledger(fleet.db)
        assert clean, text
        # The auditor's view: the host park, the wait and the resumed calls tell one story.
        code, audit, err = await maka(fleet, "audit", second_a[0])
        assert code == 0 and audit["ok"], (audit.get("findings"), err)
    finally:
        await asyncio.gather(*(stop(w) for w in workers))
        fleet.close()


@pytest.mark.parametrize(
    "tool_mode", ["activity", pytest.param("hybrid", marks=pytest.mark.slow)]
)
async def test_sessions_run_tools_only_on_their_host_and_park_while_it_is_away(
    tool_mode: str, temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    await two_host_drill(
        temporal_server, temporal_client, tmp_path, backend="sqlite", per_host=2, tool_mode=tool_mode
    )


@pytest.mark.slow
@pytest.mark.skipif(pg_base_url() is None, reason=SKIP_REASON)
async def test_two_hosts_sharing_a_postgres_ledger(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    await two_host_drill(temporal_server, temporal_client, tmp_path, backend="postgres", per_host=4)


async def test_negative_control_a_worker_that_sends_tools_to_the_shared_queue_is_caught(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    """Only host b's worker runs. The real worker parks host a's session and writes nothing of
    it; the worker built to route tools to the shared queue runs it on host b, and the same check
    (``misplaced``) that the drill relies on reports host a's file in host b's journal."""
    fleet = Fleet(temporal_server, tmp_path)
    b = fleet.worker("b")
    try:
        await ready(b)
        # Started as an operator does: ``--host`` and ``MAKA_HOST_WAIT`` read at start.
        ws = fleet.hosts["a"].root / "a-pinned"
        ws.mkdir()
        pinned = f"a-pinned-{fleet.queue}"
        code, out, err = await maka(
            fleet, "session", "start", "--workspace", str(ws), "--script", str(fleet.script),
            "--task-queue", fleet.queue, "--session-id", pinned, "--host", "a", "go",
            MAKA_HOST_WAIT=str(HOST_WAIT_S),
        )  # fmt: skip
        assert code == 0 and out.get("sessionId") == pinned, (code, out, err)
        status = await until(temporal_client, pinned, "parked")
        assert status.park_reason == "workspace_host_unavailable"
        assert fleet.misplaced("b") == [] and fleet.writes(pinned) == 0
        await temporal_client.get_workflow_handle(workflow_id_for(pinned)).terminate("negative control next")
    finally:
        await stop(b)
    wrong = fleet.worker("b", entry=UNPINNED_WORKER)
    try:
        await ready(wrong)
        misrouted = await fleet.session(temporal_client, "a", "a-misrouted")
        await until(temporal_client, misrouted, "idle")
        a_file = str((fleet.workspace(misrouted) / "a.txt").resolve())
        assert fleet.misplaced("b") == [a_file], "the check must catch a tool run off its host"
    finally:
        await stop(wrong)
        fleet.close()


@pytest.mark.slow
async def test_negative_control_a_local_attempt_that_skips_the_host_check_is_caught(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    """Only host b's worker runs, and a hybrid session is pinned to host a. The real worker's local
    attempt defers (``off_host``) and the session parks without a write; the worker built to send
    local attempts without the session's host runs host a's ``write_file`` on host b, and host b's
    journal (``misplaced``) reports it."""
    fleet = Fleet(temporal_server, tmp_path, tool_mode="hybrid")
    b = fleet.worker("b")
    try:
        await ready(b)
        pinned = await fleet.session(temporal_client, "a", "a-pinned")
        status = await until(temporal_client, pinned, "parked")
        assert status.park_reason == "workspace_host_unavailable"
        assert fleet.misplaced("b") == [] and fleet.writes(pinned) == 0
        await temporal_client.get_workflow_handle(workflow_id_for(pinned)).terminate("negative control next")
    finally:
        await stop(b)
    wrong = fleet.worker("b", entry=HOSTLESS_LOCAL_WORKER)
    try:
        await ready(wrong)
        misrouted = await fleet.session(temporal_client, "a", "a-misrouted")
        a_file = str((fleet.workspace(misrouted) / "a.txt").resolve())
        deadline = asyncio.get_running_loop().time() + 60
        while fleet.misplaced("b") != [a_file]:
            assert asyncio.get_running_loop().time() < deadline, f"b's journal: {fleet.misplaced('b')}"
            await asyncio.sleep(0.2)
    finally:
        await stop(wrong)
        fleet.close()


async def test_startup_repair_leaves_a_lost_run_of_another_hosts_session_to_that_host(
    temporal_client: Any, tmp_path: Path
) -> None:
    """A lost run's recovery reads its workspace: only a worker of the session's host settles it."""
    from maka_core.runtime import turn
    from maka_core.runtime.contracts import BeginRunInput, RunIds
    from maka_core.runtime.runtime import Runtime
    from maka_temporal.workers.host.worker import startup_repair

    ids = RunIds(session_id="lost-b", turn_id="t1", run_id="run-lost-b", invocation_id="i1")
    with LedgerStore.open(tmp_path / "ledger.sqlite") as store:
        rt = Runtime(store)
        try:
            await turn.begin_run(
                rt,
                BeginRunInput(
                    ids=ids, text="hi", ts=1, workflow_id=f"gone-{uuid.uuid4().hex}",
                    workflow_run_id=str(uuid.uuid4()), task_queue="q", workspace=str(tmp_path),
                    workspace_identity="ws-1", provider={"kind": "script"}, host="b", host_wait_s=3.0,
                ),
            )  # fmt: skip
            elsewhere = await startup_repair(temporal_client, store, rt, host="a")
            assert elsewhere.left_to_host == [ids.run_id] and elsewhere.repaired == []
            header = store.get_run(ids.run_id)
            assert header is not None and header.status == "running"
            home = await startup_repair(temporal_client, store, rt, host="b")
            assert home.repaired == [ids.run_id] and home.left_to_host == []
            header = store.get_run(ids.run_id)
            assert header is not None and header.is_terminal
        finally:
            rt.close()


async def test_a_host_parked_session_whose_execution_is_lost_is_settled_on_its_host_by_resume(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    """The execution of a session waiting for its host is terminated: the open, host-parked run is a
    lost run like any other. ``maka resume`` settles it from the ledger (the call never started:
    nothing ran) and continues it in a new execution that keeps the host and its wait: it parks on
    host a again (host b never runs it), and finishes once host a is back, no effect twice."""
    fleet = Fleet(temporal_server, tmp_path)
    b = fleet.worker("b")
    try:
        await ready(b)
        sid = await fleet.session(temporal_client, "a", "a-lost")
        await until(temporal_client, sid, "parked")
        await temporal_client.get_workflow_handle(workflow_id_for(sid)).terminate("operator: lost")
        code, out, err = await maka(fleet, "resume", sid)
        assert (code, out.get("decision")) == (0, "continue"), (code, out, err)
        with LedgerStore.open(fleet.db) as store:
            (run,) = [r for r in store.list_runs(session_id=sid) if not r.continuation_source]
            assert run.is_terminal, run
        # The continuation is a new execution, pinned to the same host with the same wait.
        status = await until(temporal_client, sid, "parked")
        assert (status.park_reason, status.host) == ("workspace_host_unavailable", "a"), status
        assert fleet.writes(sid) == 0 and fleet.misplaced("b") == []
        a = fleet.worker("a")
        try:
            await ready(a)
            code, out, err = await maka(fleet, "resume", sid, "--wait")
            assert code == 0 and out.get("state") == "idle", (code, out, err)
        finally:
            await stop(a)
        # The write never started before the loss: the continuation does not run it on its own (the
        # planner replays no call without T1); the scripted model goes on with its bash, on host a.
        assert fleet.writes(sid) == 0 and fleet.misplaced("a") == [] and fleet.misplaced("b") == []
        assert log_lines(fleet.workspace(sid) / "effects.log")["ran"] == 1
    finally:
        await stop(b)
        fleet.close()
