"""Text output shows what a model chose, never obeys it (issue 37.12).

A real session on the dev server whose model (a scripted provider: the model names the tool)
calls a tool named with a newline, a bidi override, an escape sequence and Rich markup. Every text
command that prints the name (``session status``, ``session show``, ``ledger plan --session``,
``maka audit``), in a pipe and on a terminal (a pty: Rich tables), prints it escaped on the line
it belongs to: the output has exactly its expected lines, no raw control or bidi character, the
markup literal and no hyperlink; ``--json`` carries the name exactly, with the unsafe characters as
``\\u`` escapes. Negative control: ``tests/children/old_printer.py`` (the printers as they were:
strings as they came, a Rich console that reads markup) forges a line in each, prints the raw
override, and on a terminal turns ``[link=...]`` into a hyperlink.

Beside it, every ``maka`` command module prints through ``workers/cli/base.py``'s printers (no
``click.echo`` or ``print`` of its own), so a new command cannot forget the rule.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import pty
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from temporalio.client import Client

from maka_core.facts.printable import printable, printable_block
from maka_core.ledger.resolver import resolve
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.cli.app import maka
from tests.ledger_factory import call, text, user
from tests.mcp_support import COUNTER, write_config
from tests.temporal_support import (
    REPO,
    WorkerProcess,
    in_process_worker,
    start,
    tool_step,
    wait_turn,
    write_script,
)

FORGED = "session sess-forged  state=idle  (all clear)"
#: The tool name the model chooses: a line of its own, reordered text, a colour, markup, a link.
HOSTILE = f"read_file\n{FORGED}\u202eexe.txt\x1b[31m[bold]B[/bold][link=http://example.invalid]L[/link]"
RAW = ("\n" + FORGED, "\u202e", "\x1b[31m", "\r")

NEW = (sys.executable, "-m", "maka_temporal")
OLD = (sys.executable, "-m", "tests.children.old_printer")


def _run(cmd: tuple[str, ...], args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run([*cmd, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), (args, done.stdout, done.stderr)
    return done.stdout


def _run_tty(cmd: tuple[str, ...], args: list[str], env: dict[str, str]) -> str:
    """The command's stdout on a pseudo-terminal (Rich draws its tables there); ``\\r\\n`` is the
    terminal's own line ending, read back as ``\\n``."""
    master, slave = pty.openpty()
    tty_env = {**env, "TERM": "xterm-256color", "COLUMNS": "400"}
    proc = subprocess.Popen(
        [*cmd, *args], cwd=REPO, env=tty_env, stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other end closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(120) in (0, 1), (args, proc.stderr.read() if proc.stderr else "")
    return b"".join(chunks).decode().replace("\r\n", "\n")


def _strings(value: Any) -> set[str]:
    if isinstance(value, str):
        return {value}
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return set().union(*(_strings(v) for v in items)) if items else set()


def _forged(out: str) -> bool:
    """A line of the output that the model wrote: it starts (after a table's border) with FORGED."""
    return any(line.lstrip(" │┃|").startswith(FORGED) for line in out.splitlines())


@contextlib.asynccontextmanager
async def _hostile_session(
    client: Client, server: Any, tmp: Path, ws: Path, queue: str
) -> AsyncIterator[tuple[str, dict[str, str]]]:
    """A settled session whose model called the HOSTILE tool (an unknown tool: refused, recorded),
    its worker still up (``session status`` queries the open execution), and the environment the
    ``maka`` commands read it with."""
    db = tmp / "ledger.sqlite"
    script = write_script(tmp / "s.json", [tool_step((HOSTILE, {"path": "a"})), {"text": "done"}])
    async with in_process_worker(client, db, queue):
        session, accepted = await start(client, ws, script, queue, "go")
        assert (await wait_turn(client, session, accepted.run_id)).state == "idle"
        env = {**os.environ, "MAKA_HOME": str(tmp / "home"), "MAKA_DB": str(db)}
        env["TEMPORAL_ADDRESS"] = server.address
        yield session, env


@pytest.mark.slow
@pytest.mark.temporal
@pytest.mark.asyncio(loop_scope="session")
async def test_a_hostile_tool_name_stays_on_its_line_in_every_text_command(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    async with _hostile_session(temporal_client, temporal_server, tmp_path, ws_dir, task_queue) as (
        session,
        env,
    ):
        await _every_text_command(session, env)


async def _every_text_command(session: str, env: dict[str, str]) -> None:
    shown = printable(HOSTILE)
    # (command, how many lines it prints, how many of them name the tool)
    commands: list[tuple[list[str], int | None, int]] = [
        (["session", "status", session], 3, 1),
        (["session", "show", session], 5, 2),
        (["ledger", "plan", "--session", session], 5, 1),
        (["audit", session], None, 1),
    ]
    for args, count, naming in commands:
        out, old = await asyncio.gather(
            asyncio.to_thread(_run, NEW, args, env), asyncio.to_thread(_run, OLD, args, env)
        )
        lines = out.splitlines()
        assert not any(raw in out for raw in RAW), (args, out)
        assert count is None or len(lines) == count, (args, out)
        assert sum(shown in line for line in lines) == naming, (args, out)
        assert not _forged(out), (args, out)
        assert _forged(old) and "\u202e" in old, (args, old)  # negative control
    for args in (["session", "status", session, "--json"], ["audit", session, "--json"]):
        out = await asyncio.to_thread(_run, NEW, args, env)
        assert "\u202e" not in out and "\\u202e" in out, (args, out[:400])
        assert HOSTILE in _strings(json.loads(out)), args  # the name exactly as recorded


@pytest.mark.slow
@pytest.mark.temporal
@pytest.mark.asyncio(loop_scope="session")
async def test_on_a_terminal_rich_prints_the_name_literally(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    """The Rich tables of ``session status`` and ``ledger plan`` on a pseudo-terminal: markup in
    the name is text, no hyperlink is made, the line stays one line."""
    async with _hostile_session(temporal_client, temporal_server, tmp_path, ws_dir, task_queue) as (
        session,
        env,
    ):
        await _rich_tables(session, env)


async def _rich_tables(session: str, env: dict[str, str]) -> None:
    shown = printable(HOSTILE)
    for args in (["session", "status", session], ["ledger", "plan", "--session", session]):
        out, old = await asyncio.gather(
            asyncio.to_thread(_run_tty, NEW, args, env), asyncio.to_thread(_run_tty, OLD, args, env)
        )
        assert shown in out and "[bold]B[/bold][link=http://example.invalid]L[/link]" in out, (args, out)
        assert "\x1b]8;" not in out and "\u202e" not in out and not _forged(out), (args, out)
        assert _forged(old), (args, old)  # negative control: a line of its own ...
        assert "\x1b]8;" in old and "[link=" not in old, (args, old)  # ... and a live hyperlink


def test_the_ledger_commands_show_a_recorded_hostile_name_on_one_line(tmp_path: Path) -> None:
    """The fast form, in process: a ledger holding the HOSTILE call (the ledger's own builders),
    ``ledger plan --session`` and ``session show``. Negative control: the old printer
    (``tests/children/old_printer.py``) prints the same plan with a forged line."""
    db = tmp_path / "ledger.sqlite"
    with LedgerStore.open(db) as store:
        store.append([user("go"), call("c1", HOSTILE, {"path": "a"}), text("done")])
        events = store.events()
    shown = printable(HOSTILE)
    env = {"MAKA_HOME": str(tmp_path)}
    for args, count in ((["ledger", "plan", "--session", "sess-1"], 7), (["session", "show", "sess-1"], 3)):
        result = CliRunner().invoke(maka, [*args, "--db", str(db)], env=env)
        assert result.exit_code == 0, result.output
        out = result.stdout
        assert not any(raw in out for raw in RAW) and not _forged(out), (args, out)
        assert len(out.splitlines()) == count and sum(shown in line for line in out.splitlines()) == 1, out
    assert [op["toolName"] for op in resolve(events).to_json()["operations"]] == [HOSTILE]
    old = _run(OLD, ["ledger", "plan", "--session", "sess-1", "--db", str(db)], {**os.environ, **env})
    assert _forged(old) and "\u202e" in old, old  # negative control: the old printer forges a line


def test_printable_escapes_every_unsafe_and_invisible_character_and_nothing_else() -> None:
    unsafe = "\x00\t\n\r\x1b\x7f\x85\x9b\u061c\u200e\u200f\u2028\u2029\u202a\u202e\u2066\u2069\ud800\udfff"
    out = printable(f"a{unsafe}b")
    assert out.isascii() and out.isprintable(), out
    assert out == (
        "a\\x00\\t\\n\\r\\x1b\\x7f\\x85\\x9b\\u061c\\u200e\\u200f\\u2028\\u2029\\u202a\\u202e\\u2066\\u2069"
        "\\ud800\\udfffb"
    )
    assert printable(out) == out  # idempotent
    # A one-line value shows its invisible characters too: two names that print alike are alike.
    assert printable("bob\u200b\U000e0041\u00a0") == "bob\\u200b\\U000e0041\\xa0"
    kept = "Grüße, 東京, مرحبا, emoji 🙂, [bold], ~/.bashrc, a b"
    assert printable(kept) == kept
    # A transcript keeps its lines, tabs and words; only what moves or reorders them is escaped.
    family = "👨\u200d👩"
    shown = printable_block(f"two\nlines\tand\r\x1b\u202e {family}")
    assert shown == f"two\nlines\tand\\r\\x1b\\u202e {family}"


def test_every_command_module_prints_through_the_printers() -> None:
    """No ``click.echo``, ``print``, ``sys.stdout.write`` or Rich ``print`` of a string outside
    ``workers/cli/base.py`` but the machine formats (canonical JSON lines, the JSONL export)."""
    allowed = {
        ("session.py", "sys.stdout.write"): 2,  # show --json and --follow --json: canonical lines
        ("governance.py", "sys.stdout.write"): 1,  # receipts --json: canonical lines
        ("ledger.py", "sys.stdout.write"): 1,  # export: the codec's JSONL
    }
    seen: dict[tuple[str, str], int] = {}
    for path in sorted((REPO / "workers" / "cli").glob("*.py")):
        if path.name == "base.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            if name in ("click.echo", "print", "sys.stdout.write", "sys.stderr.write"):
                seen[(path.name, name)] = seen.get((path.name, name), 0) + 1
            if name.endswith(".print") and node.args and not isinstance(node.args[0], ast.Name | ast.Call):
                seen[(path.name, name)] = seen.get((path.name, name), 0) + 1
    assert seen == allowed


@pytest.mark.slow
@pytest.mark.temporal
def test_the_workers_lifecycle_lines_show_an_mcp_servers_stderr_escaped(
    temporal_server: Any, tmp_path: Path
) -> None:
    """``maka worker`` announces each line an MCP server writes on its stderr (``mcp_log``): a
    server that writes an escape sequence, a carriage return and a bidi override gets its lines
    escaped, each attributed to it. Negative control: the worker as the old printer
    (``tests/children/old_printer.py``) writes the raw escape sequence and override."""
    loud = "hello\x1b[2J\r" + FORGED + "\u202e end"
    server = (  # the counter server, after one loud line on its stderr
        f"import runpy, sys; sys.stderr.write({loud!r} + '\\n'); sys.stderr.flush(); "
        f"sys.argv = [{str(COUNTER)!r}, '--state', {str(tmp_path)!r}]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    servers = {"loud": {"command": sys.executable, "args": ["-c", server]}}
    config = write_config(tmp_path / "mcp.json", servers)
    seen: dict[str, str] = {}
    for name, cmd in (("new", NEW), ("old", OLD)):
        entry = (*cmd[1:], "worker")
        extra = {"MAKA_MCP_CONFIG": str(config)}
        db = tmp_path / f"{name}.sqlite"
        with WorkerProcess(
            temporal_server, db, f"q-{name}", home=tmp_path / name, extra_env=extra, entry=entry
        ) as worker:
            worker.wait_ready()
            deadline = time.monotonic() + 30
            while "hello" not in worker.log.read_text(errors="replace"):
                assert time.monotonic() < deadline, worker.log.read_text()
                time.sleep(0.1)
            seen[name] = worker.log.read_text()
    # The server's stderr is read as text lines (a carriage return ends one too): each is its own
    # line, attributed to its server, escaped.
    said = [line for line in seen["new"].splitlines() if "hello" in line or FORGED in line]
    assert len(said) == 2 and all(line.startswith("maka worker: mcp server loud (stderr): ") for line in said)
    assert "hello\\x1b[2J" in said[0] and said[1].endswith(f"{FORGED}\\u202e end"), said
    assert not any(raw in seen["new"] for raw in ("\x1b", "\r", "\u202e")), seen["new"]
    assert "hello\x1b[2J" in seen["old"] and "\u202e" in seen["old"], seen["old"]  # negative control
