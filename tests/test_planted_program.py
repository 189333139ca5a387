"""A trusted read resolves outside every workspace (issue 37 item 4).

A worker started with a project's venv active has the workspace on its PATH
(``PATH=WS/.venv/bin:$PATH``). The model plants ``.venv/bin/cat`` (here: the test writes it, as the
file tools would, and makes it executable, as bash would), which appends a line to ``effects.log``
and then runs the real ``cat``. A session whose policy trusts ``cat`` as a read calls
``cat README.md``.

- Drill: the real ``maka worker`` SIGKILLs itself at P4 (the line ran, T2 not committed) and a
  fresh worker recovers the call. The sandbox's PATH holds no workspace folder, so the call runs
  the system's ``cat``, a real read, and its re-run after the kill is harmless: ``effects.log``
  stays empty, the session idle. Negative control: workers with the sandbox PATH and classifier as
  before (``tests/children/verbatim_path_worker.py``) run the planted program as a trusted read,
  and again after the kill: two lines.
- Variants: a relative PATH entry (``bin``, which bash reads from the workspace, its working
  folder) and a folder outside the workspace that is a symlink to it, the same verdicts; a system
  folder's ``cat`` that is a symlink into the workspace is no read for the classifier (unit test).
- A read-only policy (``mutations: deny``) with ``allowedCommands: [cat]``: the planted program never
  runs (the system's cat does); negative control: the old worker admits it and the program runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from maka_core.governance.classify import classify_bash
from maka_core.governance.policy_file import parse_policy
from maka_core.runtime.governed import SessionGovernance
from maka_core.runtime.session_view import operations
from maka_core.store.writer import LedgerStore
from maka_core.tools.programs import in_workspace, program_path, system_program
from maka_core.workspace import Workspace
from tests.temporal_support import WorkerProcess, start, tool_step, wait_turn, write_script

TODAY = ("-m", "maka_temporal", "worker")
VERBATIM = ("-m", "tests.children.verbatim_path_worker")
TRUSTING_CAT = {"policyVersion": "1", "trustedReadCommands": ["ls", "cat"]}
READ_ONLY_CAT = {"policyVersion": "1", "mutations": "deny", "allowedCommands": ["cat"]}
ASYNC = pytest.mark.asyncio(loop_scope="session")


def plant(folder: Path, log: Path) -> Path:
    """An executable ``cat`` in ``folder`` that logs its run to ``log`` and then reads as cat does."""
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / "cat"
    program.write_text(f'#!/bin/sh\necho planted >> {log}\nexec /bin/cat "$@"\n')
    program.chmod(0o755)
    return program


def effects(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


# --- the lookup itself ----------------------------------------------------------------------------


def test_the_programs_path_holds_no_workspace_folder_and_no_relative_entry(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    ws = Workspace.open(tmp_path / "ws")
    venv_bin = ws.root / ".venv" / "bin"
    plant(venv_bin, ws.root / "effects.log")
    linked = tmp_path / "linked"
    linked.symlink_to(venv_bin)  # a folder outside that is the workspace's
    system = tmp_path / "sysbin"
    system.mkdir()
    source = os.pathsep.join([str(venv_bin), "", ".", "bin", str(linked), str(system), "/usr/bin", "/bin"])
    kept = program_path(source).split(os.pathsep)
    assert kept == [str(system), "/usr/bin", "/bin"], kept
    assert in_workspace(str(venv_bin)) and in_workspace(str(linked)) and not in_workspace(str(system))
    # Nothing usable given: the default path, still without a workspace folder.
    assert program_path(str(venv_bin)).split(os.pathsep)[-1] == "/bin"


def test_a_bare_name_resolves_to_the_systems_program_or_to_nothing(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    ws = Workspace.open(tmp_path / "ws")
    planted = plant(ws.root / "bin", ws.root / "effects.log")
    system = tmp_path / "sysbin"
    system.mkdir()
    (system / "cat").symlink_to(planted)  # a system folder's entry that lands in the workspace
    assert system_program("cat", str(system)) is None
    assert system_program("cat", "/usr/bin:/bin") in ("/usr/bin/cat", "/bin/cat")
    assert system_program("./cat") is None and system_program("") is None
    # The classifier asks the same question: the planted name is no read, the system's is.
    assert (
        classify_bash("cat README.md", lambda n: system_program(n, str(system)) is not None).effect
        == "mutate"
    )
    assert (
        classify_bash("cat README.md", lambda n: system_program(n, "/usr/bin:/bin") is not None).effect
        == "read"
    )
    assert classify_bash("pwd", lambda n: False).effect == "read"  # a builtin is bash's own


# --- drills through real workers ------------------------------------------------------------------


async def _session(
    server: Any,
    client: Any,
    tmp_path: Path,
    queue: str,
    policy: dict[str, Any],
    path_entry: str,
    entry: tuple[str, ...],
    *,
    kill: bool,
) -> tuple[Any, Any, list[str]]:
    """``cat README.md`` in a workspace whose planted ``cat`` sits where ``path_entry`` (relative to
    the workspace, or ``link``: a symlinked folder outside it) puts it first on the worker's PATH."""
    ws_dir = tmp_path / "ws"
    ws_dir.mkdir()
    ws = Workspace.open(ws_dir)
    (ws.root / "README.md").write_text("hello\n")
    log = ws.root / "effects.log"  # in the workspace: the sandbox's /tmp is its own
    planted_in = ws.root / ".venv" / "bin"
    plant(planted_in, log)
    if path_entry == "link":
        first = tmp_path / "toolbin"
        first.symlink_to(planted_in)
        path_first = str(first)
    elif path_entry == "relative":
        plant(ws.root / "bin", log)
        path_first = "bin"
    else:
        path_first = str(planted_in)
    env = {"PATH": f"{path_first}{os.pathsep}{os.environ['PATH']}"}
    db = tmp_path / "ledger.sqlite"
    session_id = f"planted-{queue}"
    with LedgerStore.open(db) as store:
        store.put_session_policy(session_id, **SessionGovernance(parse_policy(policy)).to_record())
    script = write_script(
        tmp_path / "s.json", [tool_step(("bash", {"command": "cat README.md"})), {"text": "ok"}]
    )
    kw: dict[str, Any] = {"home": tmp_path, "entry": entry, "extra_env": env}
    if kill:
        with WorkerProcess(server, db, queue, failpoint="P4", failpoint_tag="bash", **kw) as doomed:
            doomed.wait_ready()
            _, accepted = await start(client, ws_dir, script, queue, session_id=session_id)
            assert await doomed.wait_exit() == -9, doomed.log.read_text()
    with WorkerProcess(server, db, queue, **kw) as worker:
        worker.wait_ready()
        if not kill:
            _, accepted = await start(client, ws_dir, script, queue, session_id=session_id)
        status = await wait_turn(client, session_id, accepted.run_id, timeout=90)
    with LedgerStore.open(db) as store:
        assert store.verify() == []
        (op,) = operations(store.events(session_id=session_id))
    return status, op, effects(log)


@pytest.mark.temporal
@pytest.mark.crash
@pytest.mark.slow
@ASYNC
@pytest.mark.parametrize(
    ("path_entry", "entry"),
    [("venv", TODAY), ("relative", TODAY), ("link", TODAY), ("venv", VERBATIM)],
    ids=["venv-on-path", "relative-entry", "symlinked-folder", "negative-control-verbatim-path"],
)
async def test_a_planted_cat_is_no_trusted_read_and_never_runs_twice(
    temporal_server: Any,
    temporal_client: Any,
    tmp_path: Path,
    task_queue: str,
    path_entry: str,
    entry: tuple[str, ...],
) -> None:
    status, op, ran = await _session(
        temporal_server, temporal_client, tmp_path, task_queue, TRUSTING_CAT, path_entry, entry, kill=True
    )
    if entry == VERBATIM:  # the planted program ran as a trusted read, and again after the kill
        assert (ran, status.state) == (["planted", "planted"], "idle"), (ran, status)
        return
    # The sandbox ran the system's cat, a real read, run again after the kill: harmless.
    assert (ran, status.state, op.status) == ([], "idle", "completed"), (ran, status)


@pytest.mark.temporal
@ASYNC
@pytest.mark.parametrize("entry", [TODAY, VERBATIM], ids=["today", "negative-control-verbatim-path"])
async def test_a_read_only_policy_never_lets_a_planted_read_run(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, task_queue: str, entry: tuple[str, ...]
) -> None:
    status, op, ran = await _session(
        temporal_server, temporal_client, tmp_path, task_queue, READ_ONLY_CAT, "venv", entry, kill=False
    )
    if entry == VERBATIM:  # judged a read, admitted, and the planted program ran
        assert ran == ["planted"] and op.dispatch_event_id, (ran, op)
        return
    assert ran == [] and status.state == "idle", (ran, op)  # the read was the system's cat
