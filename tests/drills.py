"""Crash-drill harness shared by the kill matrix, the soak, the server-restart and the repair-race tests.

A *drill* is one sandbox (its own ledger file, workspace, effect journal and task queue) driven by
real ``maka worker`` processes: a worker armed with ``MAKA_FAILPOINT`` (+ ``_TAG``/``_SKIP``) SIGKILLs
itself at a crash boundary, the next one starts without it, and the session is left to settle. Then
the drill collects the facts a reviewer needs: the session's state, the Resolver's view of every
operation, the terminal facts per run, ``maka ledger verify`` run through the real CLI, and the
ground truth of side effects.

Ground truth is outside the ledger on purpose. File tools append one fsynced line per real write to
the effect journal (``MAKA_EFFECT_LOG``, ``maka_core/tools/effect_journal.py``), so even an identical
second write is counted; ``bash`` appends a line to ``effects.log`` in the workspace. The scripted
turn's edit is re-applicable ("draft" still occurs once after the edit), so a duplicate edit would
also show in the file's content.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from temporalio.client import WorkflowUpdateFailedError

from maka_core.runtime.session_view import operations
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from maka_temporal.workers.client.session_client import query_status
from maka_temporal.workflows.contracts import (
    SEND_MESSAGE,
    SendMessage,
    SessionConfig,
    SessionInput,
    TurnAccepted,
    workflow_id_for,
)
from maka_temporal.workflows.session import SessionWorkflow
from maka_temporal.workflows.session_policy import initial_search_attributes
from tests.pg_support import fresh_pg_schema
from tests.temporal_support import WorkerProcess, start

FIXTURES = Path(__file__).resolve().parent / "fixtures"
DRILL_SCRIPT = FIXTURES / "drill_script.json"
#: The scripted turn's tools, in call order (step k calls TOOLS[k]).
TOOLS: tuple[str, ...] = ("write_file", "edit_file", "bash")
NOTES_AFTER_TURN = "status: draft, reviewed\n"
#: The negative control's worker: the same worker built with a deliberately broken guard.
NAIVE_WORKER: tuple[str, ...] = ("-m", "tests.children.naive_worker")
HEARTBEAT_S = 2.0
#: Where a sandbox keeps its ledger: a SQLite file, or a fresh schema on ``MAKA_TEST_POSTGRES_URL``.
Backend = Literal["sqlite", "postgres"]


@dataclass(frozen=True)
class Kill:
    """One armed worker: it must SIGKILL itself at ``failpoint`` (tag, after ``skip`` matching hits)."""

    failpoint: str
    tag: str | None = None
    skip: int = 0

    @property
    def label(self) -> str:
        text = self.failpoint if self.tag is None else f"{self.failpoint}[{self.tag}]"
        return f"{text}+{self.skip}" if self.skip else text

    def env(self) -> dict[str, str]:
        return {"MAKA_FAILPOINT_SKIP": str(self.skip)} if self.skip else {}


@dataclass(frozen=True)
class Expect:
    """What the seed's crash table says a cell must end in.

    ``ops`` maps each tool that must have an operation to ``(status, reason)`` (reason ``None``: any);
    a tool absent from ``ops`` must have no operation at all. ``effects`` is the exact number of real
    side effects per tool.
    """

    state: str
    reason: str | None
    ops: dict[str, tuple[str, str | None]]
    effects: dict[str, int]
    notes: str | None = None


@dataclass(frozen=True)
class Cell:
    """One matrix cell: the kills in order, what must follow, and the tool at the kill point."""

    name: str
    kills: tuple[Kill, ...]
    expect: Expect | None = None
    tool: str | None = None
    guard_disabled: bool = False
    #: The session's ``tool_mode`` (``hybrid``: the file tools' first dispatch is a local activity).
    tool_mode: str = "activity"


@dataclass
class CellResult:
    cell: Cell
    session_id: str = ""
    state: str = "?"
    park_reason: str | None = None
    kills: int = 0
    effects: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    ops: dict[str, tuple[str, str]] = field(default_factory=dict)
    corruption: int = 0
    terminal_facts: dict[str, int] = field(default_factory=dict)
    verify_clean: bool = False
    verify_output: str = ""
    recovery_s: float | None = None
    notes: str | None = None
    problems: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and not self.problems


# --- the sandbox -----------------------------------------------------------------------------------


class Sandbox:
    """One drill's private ledger, workspace, effect journal and task queue on a shared server."""

    def __init__(
        self, server: Any, root: Path, *, guard_disabled: bool = False, backend: Backend = "sqlite"
    ) -> None:
        self.server = server
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._resources = ExitStack()
        #: A SQLite file, or a URL on a fresh PostgreSQL schema (dropped by ``close``).
        self.db: Path | str = (
            root / "ledger.sqlite"
            if backend == "sqlite"
            else self._resources.enter_context(fresh_pg_schema())
        )
        self.ws = root / "ws"
        self.ws.mkdir(exist_ok=True)
        self.journal = root / "effects.jsonl"
        self.queue = f"drill-{uuid.uuid4().hex[:10]}"
        self.guard_disabled = guard_disabled
        self._workers = 0

    def worker(self, kill: Kill | None = None) -> WorkerProcess:
        """Start ``maka worker`` (armed with ``kill`` when given) as a child process."""
        self._workers += 1
        env = {"MAKA_EFFECT_LOG": str(self.journal)}
        if kill is not None:
            env.update(kill.env())
        return WorkerProcess(
            self.server,
            self.db,
            self.queue,
            home=self.root,
            failpoint=kill.failpoint if kill else None,
            failpoint_tag=kill.tag if kill else None,
            heartbeat_timeout=HEARTBEAT_S,
            extra_env=env,
            log=self.root / f"worker-{self._workers}.log",
            **({"entry": NAIVE_WORKER} if self.guard_disabled else {}),
        )

    def close(self) -> None:
        """Drop the PostgreSQL schema (after every worker has stopped); nothing for SQLite."""
        self._resources.close()

    async def verify(self) -> tuple[bool, str]:
        """``maka ledger verify --db <ledger> --json`` through the real CLI: (clean, output)."""
        return await verify_ledger(self.db)

    def file_effects(self) -> Counter[tuple[str, str]]:
        """Real writes per (tool, path) from the effect journal."""
        return file_effects(self.journal)

    def log_lines(self, ws: Path | None = None) -> Counter[str]:
        """Lines per content in the workspace's ``effects.log`` (one line per real ``bash`` run)."""
        return log_lines((ws or self.ws) / "effects.log")


def maka_cli() -> list[str]:
    script = Path(sys.executable).parent / "maka"
    return [str(script)] if script.exists() else [sys.executable, "-m", "maka_temporal"]


async def verify_ledger(db: Path | str) -> tuple[bool, str]:
    proc = await asyncio.create_subprocess_exec(
        *maka_cli(), "ledger", "verify", "--db", str(db), "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    text = out.decode(errors="replace").strip()
    try:
        clean = proc.returncode == 0 and json.loads(text.splitlines()[-1])["ok"] is True
    except (ValueError, KeyError, IndexError):
        clean = False
    return clean, text


def file_effects(journal: Path) -> Counter[tuple[str, str]]:
    counts: Counter[tuple[str, str]] = Counter()
    if journal.exists():
        for line in journal.read_text().splitlines():
            entry = json.loads(line)
            counts[(entry["tool"], entry["path"])] += 1
    return counts


def log_lines(path: Path) -> Counter[str]:
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()


def duplicates(counts: Iterable[int]) -> int:
    """Side effects beyond the first, summed over operations."""
    return sum(max(0, n - 1) for n in counts)


# --- waiting -----------------------------------------------------------------------------------------


async def ready(worker: WorkerProcess, timeout: float = 120.0) -> None:
    await asyncio.to_thread(worker.wait_ready, timeout)


async def stop(worker: WorkerProcess) -> None:
    await asyncio.to_thread(worker.stop)


async def settle(
    client: Any, session_id: str, run_id: str | None = None, *, timeout: float = 120.0, interval: float = 0.05
) -> Any:
    """The session's status once nothing is running (and turn ``run_id`` is over, when given).

    Tolerates a session that is briefly unreachable (no worker to answer the query, a server that is
    coming back): it keeps asking until ``timeout``.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            status = await asyncio.wait_for(query_status(client, session_id), 10)
            last = status
            current = status.current_turn
            over = current is None or (run_id is not None and current.run_id != run_id)
            if over and status.state != "running":
                return status
        except Exception as exc:  # no worker yet, server restarting: ask again
            last = exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"session {session_id} did not settle in {timeout:.0f}s (last: {last!r})")
        await asyncio.sleep(interval)


async def open_session(
    client: Any,
    ws: Path,
    script: Path,
    queue: str,
    *,
    session_id: str,
    host: str | None = None,
    host_wait_s: float | None = None,
) -> None:
    """Start a session's workflow without a message (messages go through ``send``); ``host`` pins
    it to a workspace host (tools on that host's queue)."""
    ident = Workspace.open(ws, create=True)
    inp = SessionInput(
        session_id=session_id,
        workspace=str(ident.root),
        workspace_identity=ident.identity,
        task_queue=queue,
        config=SessionConfig(
            provider={"kind": "script", "path": str(script)},
            host=host,
            host_wait_s=host_wait_s if host else None,
        ),
    )
    await client.start_workflow(
        SessionWorkflow.run,
        inp,
        id=workflow_id_for(session_id),
        task_queue=queue,
        search_attributes=initial_search_attributes(session_id),
        # A worker killed inside a workflow task (a local model step) is replaced after this.
        task_timeout=timedelta(seconds=3),
    )


async def send(client: Any, session_id: str, text: str, *, update_id: str, timeout: float = 180.0) -> Any:
    """Send one message and return its ``TurnAccepted``, surviving worker and server deaths.

    A retry reuses ``update_id``, which the server deduplicates, so a message whose first attempt
    was in fact accepted never starts a second turn. A validator refusal
    (``WorkflowUpdateFailedError``) is raised at once.
    """
    handle = client.get_workflow_handle(workflow_id_for(session_id))
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await asyncio.wait_for(
                handle.execute_update(
                    SEND_MESSAGE, SendMessage(text=text), id=update_id, result_type=TurnAccepted
                ),
                30,
            )
        except WorkflowUpdateFailedError:
            raise
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


# --- one cell ------------------------------------------------------------------------------------------


async def run_cell(
    server: Any,
    client: Any,
    root: Path,
    cell: Cell,
    script: Path = DRILL_SCRIPT,
    *,
    backend: Backend = "sqlite",
    before_start: Callable[[Sandbox, str], None] | None = None,
) -> CellResult:
    """Kill a worker at each of ``cell.kills`` in turn, restart clean, settle, collect and check.

    ``before_start(box, session_id)`` runs once, after the first worker is ready and before the
    session starts (a variant of the matrix records a policy and starts an approver there)."""
    result = CellResult(cell)
    box = Sandbox(
        server,
        root / cell.name.replace(" ", "_").replace("/", "_"),
        guard_disabled=cell.guard_disabled,
        backend=backend,
    )
    try:
        return await _run_cell(client, box, cell, script, result, before_start)
    finally:
        box.close()


async def _run_cell(
    client: Any,
    box: Sandbox,
    cell: Cell,
    script: Path,
    result: CellResult,
    before_start: Callable[[Sandbox, str], None] | None,
) -> CellResult:
    run_id = ""
    last_death = 0.0
    try:
        for kill in cell.kills:
            doomed = box.worker(kill)
            try:
                await ready(doomed)
                if not result.session_id:
                    session_id = f"sess-{uuid.uuid4()}"
                    if before_start is not None:
                        before_start(box, session_id)
                    result.session_id, accepted = await start(
                        client, box.ws, script, box.queue, session_id=session_id, tool_mode=cell.tool_mode
                    )
                    run_id = accepted.run_id
                code = await doomed.wait_exit(timeout=90)
            finally:
                await stop(doomed)
            last_death = time.monotonic()
            if code != -9:
                raise RuntimeError(f"worker armed with {kill.label} exited {code}, not by SIGKILL")
            result.kills += 1
        survivor = box.worker()
        try:
            await ready(survivor)
            status = await settle(client, result.session_id, run_id)
            result.recovery_s = time.monotonic() - last_death
        finally:
            await stop(survivor)
        result.state, result.park_reason = status.state, status.park_reason
        collect(box, result)
        result.verify_clean, result.verify_output = await box.verify()
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    if cell.expect is not None:
        result.problems = check(cell.expect, result)
    return result


def collect(box: Sandbox, result: CellResult) -> None:
    """The cell's facts: operations by tool, terminal facts per run, corruption, effects."""
    with LedgerStore.open(box.db) as store:
        events = store.events(session_id=result.session_id)
    for op in operations(events):
        result.ops[op.tool_name or "?"] = (op.status, op.reason)
        result.corruption += op.status == "corruption"
    result.terminal_facts = dict(Counter(e.run_id for e in events if e.is_terminal))
    files = box.file_effects()
    bash = box.log_lines()
    result.effects = {
        "write_file": sum(n for (tool, _), n in files.items() if tool == "write_file"),
        "edit_file": sum(n for (tool, _), n in files.items() if tool == "edit_file"),
        "bash": sum(bash.values()),
    }
    result.duplicates = duplicates([*files.values(), *bash.values()])
    notes = box.ws / "notes.txt"
    result.notes = notes.read_text() if notes.exists() else None


def check(expect: Expect, result: CellResult) -> list[str]:
    """Every way the cell differs from the crash table (empty: the cell passes)."""
    problems: list[str] = []
    if result.state != expect.state or result.park_reason != expect.reason:
        problems.append(
            f"session {result.state}/{result.park_reason}, expected {expect.state}/{expect.reason}"
        )
    if set(result.ops) != set(expect.ops):
        problems.append(f"operations for {sorted(result.ops)}, expected {sorted(expect.ops)}")
    for tool, (status, reason) in expect.ops.items():
        got = result.ops.get(tool)
        if got is not None and (got[0] != status or (reason is not None and got[1] != reason)):
            problems.append(f"{tool} op {got[0]}/{got[1]}, expected {status}/{reason or '*'}")
    if result.effects != expect.effects:
        problems.append(f"effects {result.effects}, expected {expect.effects}")
    if result.duplicates:
        problems.append(f"{result.duplicates} duplicate side effect(s)")
    if expect.notes is not None and result.notes != expect.notes:
        problems.append(f"notes.txt {result.notes!r}, expected {expect.notes!r}")
    if result.corruption:
        problems.append(f"{result.corruption} corrupt operation(s)")
    if not result.terminal_facts or any(n != 1 for n in result.terminal_facts.values()):
        problems.append(f"terminal facts per run {result.terminal_facts}, expected exactly 1 each")
    if not result.verify_clean:
        problems.append(f"maka ledger verify: {result.verify_output}")
    return problems


async def run_cells(
    server: Any, client: Any, root: Path, cells: Sequence[Cell], *, parallel: int, backend: Backend = "sqlite"
) -> list[CellResult]:
    """Run cells concurrently, at most ``parallel`` at a time, in the given order."""
    gate = asyncio.Semaphore(parallel)

    async def one(cell: Cell) -> CellResult:
        async with gate:
            return await run_cell(server, client, root, cell, backend=backend)

    return list(await asyncio.gather(*(one(c) for c in cells)))


# --- reporting -------------------------------------------------------------------------------------------


def _effects_text(effects: dict[str, int]) -> str:
    return "/".join(str(effects.get(t, 0)) for t in TOOLS)


def _op_text(result: CellResult, tool: str | None) -> str:
    if tool is None or tool not in result.ops:
        return "-"
    status, reason = result.ops[tool]
    short = {
        "recovery_bundle_completed": "finalized",
        "matching_response": "",
        "dispatch_without_response": "no T2",
    }
    note = short.get(reason, reason)
    return f"{status} ({note})" if note else status


def format_table(
    results: Sequence[CellResult], *, title: str, verdict: Callable[[CellResult], str] | None = None
) -> str:
    """The matrix as a fixed-width table: one row per cell, then the figures."""
    verdict = verdict or (lambda r: "ok" if r.passed else "FAIL")
    header = (
        f"{'cell':<30} {'kills':>5}  {'session':<40} {'op at the kill point':<40} "
        f"{'W/E/B':>5} {'dup':>3} {'verify':>6} {'death->settled':>14}  result"
    )
    lines = [title, header, "-" * len(header)]
    for r in results:
        session = r.state + (f" ({r.park_reason})" if r.park_reason else "")
        secs = f"{r.recovery_s:.1f}s" if r.recovery_s is not None else "-"
        lines.append(
            f"{r.cell.name:<30} {r.kills:>5}  {session:<40} {_op_text(r, r.cell.tool):<40} "
            f"{_effects_text(r.effects):>5} {r.duplicates:>3} {'clean' if r.verify_clean else 'DIRTY':>6} "
            f"{secs:>14}  {verdict(r)}"
        )
        for problem in ([r.error] if r.error else []) + r.problems:
            lines.append(f"{'':<30}   ! {problem}")
    lines.append("-" * len(header))
    lines.append(summary(results))
    return "\n".join(lines)


def summary(results: Sequence[CellResult]) -> str:
    times = [r.recovery_s for r in results if r.recovery_s is not None]
    counts = (
        f"cells passed: {sum(r.passed for r in results)}/{len(results)}; "
        f"kills: {sum(r.kills for r in results)}; "
        f"duplicates found: {sum(r.duplicates for r in results)}; "
        f"corrupt operations: {sum(r.corruption for r in results)}"
    )
    if not times:
        return counts
    return (
        f"{counts}; death->settled mean {statistics.mean(times):.1f}s, "
        f"median {statistics.median(times):.1f}s, max {max(times):.1f}s"
    )
