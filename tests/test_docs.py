"""The documentation runs as written: the README and the docs site (``docs/``) hold no code a reader
would run that no test runs, and no ``maka`` command line the CLI does not take.

- Every ``python`` block is accounted for: included from ``examples/`` (``tests/test_examples.py``
  runs those), marked ``<!-- docs-test: run ID -->`` (run here, as a reader would: the file written
  out and started as its own process), or marked ``<!-- docs-test: fragment -->`` (a piece of a
  program, compiled here). Negative control: an unmarked block is named by the check.
- Blocks sharing an id (the README's examples are the docs' too) are the same text.
- Every ``maka ...`` line of a shell block names a command that exists and only options it takes.
  Negative control: a made-up option and a made-up command are named by the check.
- ``examples/README.md``'s table describes each folder as its files are: every file it names
  exists, and every piece of code it quotes is in one of them. Negative control: the ``own_tool``
  row as it read before (``tools.py`` as "a plain object with the members of
  ``maka_core.tools.Tool``"), and a wrong ``guarantee=``, are named.
- The runnable blocks run against the test session's dev server: the README's CLI example (with a
  ``maka worker``: the walk changes the port and audits clean), the library example (a local
  OpenAI-wire server stands in for the vendor: the tool's result reaches it; negative control: the
  same program without the tool in its plugin, whose call is refused), and the library's MCP
  example (``MakaPlugin(mcp_config=...)`` serving PyPI's ``mcp-server-time``: the call completes
  with the server's answer).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest

from maka_temporal.workers.cli.app import maka
from tests.temporal_support import REPO, WorkerProcess
from tests.test_providers import ChatServer, completion

DOCS = REPO / "docs"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
MARK = re.compile(r"<!-- docs-test: (run (?P<id>[\w-]+)|fragment) -->\s*$")
INCLUDE = re.compile(r'^--8<-- "(?P<path>[^"]+)"\s*$')


@dataclass(frozen=True)
class Block:
    file: Path
    line: int
    lang: str
    text: str
    mark: str | None  # "fragment", "run", or None
    run_id: str | None

    def where(self) -> str:
        return f"{self.file.relative_to(REPO)}:{self.line}"


def doc_files() -> list[Path]:
    pages = [p for p in DOCS.rglob("*.md") if "_pending" not in p.relative_to(DOCS).parts]
    return [REPO / "README.md", *sorted(pages)]


def blocks_of(path: Path, text: str | None = None) -> list[Block]:
    text = path.read_text() if text is None else text
    found = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.search(before)
        found.append(
            Block(
                file=path,
                line=text.count("\n", 0, m.start()) + 1,
                lang=m.group(1),
                text=m.group(2),
                mark=None if mark is None else ("fragment" if mark.group("id") is None else "run"),
                run_id=None if mark is None else mark.group("id"),
            )
        )
    return found


def all_blocks() -> list[Block]:
    return [b for f in doc_files() for b in blocks_of(f)]


#: The runnable blocks and the tests that run them (a new id needs a test here).
RUNNERS = {"cli-example", "library-example", "library-mcp"}


def unaccounted(blocks: list[Block]) -> list[str]:
    """The python blocks no test runs or compiles, and the marks naming no runner."""
    problems = []
    for b in blocks:
        if b.lang != "python":
            continue
        include = INCLUDE.match(b.text.strip())
        if include is not None:
            if not include.group("path").startswith("examples/"):
                problems.append(f"{b.where()}: includes {include.group('path')}, which no test runs")
        elif b.mark is None:
            problems.append(f"{b.where()}: a python block neither run nor marked a fragment")
        elif b.mark == "run" and b.run_id not in RUNNERS:
            problems.append(f"{b.where()}: no test runs {b.run_id!r}")
    return problems


def test_every_python_block_is_run_or_is_a_marked_fragment() -> None:
    assert unaccounted(all_blocks()) == []
    # Negative control: an unmarked block, and a mark no test answers, are named.
    page = "# x\n\n```python\nprint(1)\n```\n\n<!-- docs-test: run nobody -->\n```python\nx = 1\n```\n"
    problems = unaccounted(blocks_of(REPO / "README.md", page))
    assert len(problems) == 2 and "neither run nor marked" in problems[0] and "nobody" in problems[1]


def test_fragments_compile() -> None:
    for b in all_blocks():
        if b.mark == "fragment" and b.lang == "python":
            # A fragment may await at its top level (it stands inside a coroutine).
            compile(b.text, b.where(), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def test_each_runnable_block_exists_and_copies_agree() -> None:
    by_id: dict[str, list[Block]] = {}
    for b in all_blocks():
        if b.run_id is not None:
            by_id.setdefault(b.run_id, []).append(b)
    assert set(by_id) == RUNNERS
    for run_id, copies in by_id.items():
        assert len({c.text for c in copies}) == 1, f"{run_id}: {[c.where() for c in copies]} differ"
    # The README shows the two first-run examples the docs explain.
    assert {b.run_id for b in blocks_of(REPO / "README.md")} >= {"cli-example", "library-example"}


def test_the_readme_is_a_front_page() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for target in re.findall(r"\]\(((?!https?:)[^)#]+)", readme):
        assert (REPO / target).exists(), f"README links to {target}, which does not exist"


# --- every `maka ...` line names a real command and real options -----------------------------------


def command_lines(blocks: list[Block]) -> list[tuple[str, str]]:
    """``(where, line)`` of each ``maka`` command in the shell and console blocks."""
    found = []
    for b in blocks:
        if b.lang not in ("sh", "bash", "console", "shell"):
            continue
        for line in b.text.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            line = re.sub(r"^(\w+=\S*\s+)+", "", line)  # MAKA_TOOLS=... maka worker
            if line.startswith("maka "):
                found.append((b.where(), line))
    return found


def cli_problems(where: str, line: str) -> list[str]:
    words = shlex.split(line.split(" #", 1)[0].replace("[", " ").replace("]", " "))[1:]
    command: click.Command = maka
    path = ["maka"]
    ctx = click.Context(maka)
    while isinstance(command, click.Group) and words and not words[0].startswith("-"):
        sub = command.get_command(ctx, words[0])
        if sub is None:
            return [f"{where}: {' '.join(path)} has no command {words[0]!r}: {line}"]
        command, path = sub, [*path, words.pop(0)]
    taken = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}
    problems = []
    for word in words:
        for option in word.split("|"):
            name = option.split("=", 1)[0]
            if name.startswith("-") and name not in taken and not re.fullmatch(r"-?\d[\d.]*", name):
                problems.append(f"{where}: {' '.join(path)} takes no {name}: {line}")
    return problems


def test_every_maka_command_line_exists_in_the_cli() -> None:
    lines = command_lines(all_blocks())
    assert len(lines) > 40  # the docs hold the commands (a broken extraction finds none)
    problems = [p for where, line in lines for p in cli_problems(where, line)]
    assert problems == []
    # Negative control: a made-up option and a made-up command are named.
    assert cli_problems("x", "maka session start --workspace w --no-such-flag m")
    assert cli_problems("x", "maka session frobnicate S")
    assert cli_problems("x", "maka ledger plan --db D --session S [--run R] --json") == []


def examples_readme_problems(text: str) -> list[str]:
    """What ``examples/README.md``'s table says of each folder that its files do not bear out: a
    file it names that is missing, or a quoted piece of code (`` `guarantee="read-only"` ``,
    `` `run_session` ``, `` `@tool` ``) found in none of the files it names."""
    problems = []
    for row in re.findall(r"^\| `(\w+)/` \|(.*)$", text, re.M):
        folder, cells = REPO / "examples" / row[0], row[1]
        named = sorted(set(re.findall(r"`([\w.]+\.(?:py|json))`", cells)))
        sources = ""
        for name in named:
            if not (folder / name).is_file():
                problems.append(f"examples/{row[0]}/{name}: named, missing")
            else:
                sources += (folder / name).read_text()
        for code in re.findall(r"`([^`]+)`", cells):
            prose = code.endswith((".py", ".json")) or code.startswith("python ")
            if prose or not re.search(r"[=@_(]", code):
                continue
            if code not in sources:
                problems.append(f"examples/{row[0]}: `{code}` is in none of {named}")
    return problems


def test_the_examples_readme_describes_its_files_as_they_are() -> None:
    text = (REPO / "examples" / "README.md").read_text()
    assert len(re.findall(r"^\| `\w+/` \|", text, re.M)) == 3, "the table's rows were not found"
    assert examples_readme_problems(text) == []
    # Negative control: a description of tools.py as something it is not is named.
    wrong = text.replace('`guarantee="read-only"`', '`guarantee="idempotent"`')
    assert [p for p in examples_readme_problems(wrong) if "idempotent" in p], wrong
    # ... as is the row as it read before (issue 32.3): tools.py is not "a plain object".
    old = (
        "`tools.py`: a `@tool` function over a pydantic model, `guarantee=\"read-only\"`",
        "`tools.py`: a plain object with the members of `maka_core.tools.Tool`",
    )
    assert old[0] in text
    assert any("maka_core.tools.Tool" in p for p in examples_readme_problems(text.replace(*old)))
    assert any("gone.py" in p for p in examples_readme_problems(text.replace("`tools.py`", "`gone.py`")))


# --- the runnable blocks, run ---------------------------------------------------------------------


def runnable(run_id: str) -> str:
    return next(b.text for b in all_blocks() if b.run_id == run_id)


def _env(server: Any, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKA_", "TEMPORAL_", "OPENAI_"))}
    env.update({"MAKA_HOME": str(home), "TEMPORAL_ADDRESS": server.address, "PYTHONUNBUFFERED": "1"})
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `maka`
    env.update(extra)
    return env


def _run_program(source: str, cwd: Path, env: dict[str, str]) -> str:
    """The block as a reader runs it: saved as a file, started as its own process."""
    (cwd / "app.py").write_text(source)
    done = subprocess.run(
        [sys.executable, "app.py"], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _tool_results(env: dict[str, str], tool: str) -> list[dict[str, Any]]:
    """The committed results of ``tool``'s calls, in ledger order, read from the ledger file."""
    with contextlib.closing(sqlite3.connect(Path(env["MAKA_HOME"]) / "ledger.sqlite")) as db:
        rows = db.execute(
            "SELECT payload_json FROM runtime_events WHERE event_kind = 'function_response' "
            "ORDER BY ledger_seq"
        ).fetchall()
    contents = [json.loads(payload)["content"] for (payload,) in rows]
    return [c for c in contents if c.get("name") == tool]


@pytest.fixture(scope="module")
def library_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ledger for the library programs: they serve the queue ``my-app`` as a reader's would,
    and a queue is served against one ledger (``ledger_mismatch``)."""
    return tmp_path_factory.mktemp("library") / "home"


@pytest.mark.temporal
@pytest.mark.slow
def test_the_cli_example_runs(temporal_server: Any, tmp_path: Path) -> None:
    home = tmp_path / "home"
    queue = f"docs-cli-{tmp_path.name}"[:60]
    env = _env(temporal_server, home, MAKA_TASK_QUEUE=queue)
    with WorkerProcess(temporal_server, home / "ledger.sqlite", queue, home=home) as worker:
        worker.wait_ready()
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", runnable("cli-example")],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((tmp_path / "proj" / "config.json").read_text()) == {"port": 4000}
    assert "The port is 4000." in done.stdout, done.stdout


@pytest.mark.temporal
@pytest.mark.slow
def test_the_library_example_runs(temporal_server: Any, tmp_path: Path, library_home: Path) -> None:
    source = runnable("library-example")
    vendor = ChatServer()
    try:
        env = _env(temporal_server, library_home, OPENAI_BASE_URL=vendor.url, OPENAI_API_KEY="sk-docs")
        (tmp_path / "proj").mkdir()
        args = json.dumps({"text": "to be or not"})
        call = {"id": "c1", "type": "function", "function": {"name": "word_count", "arguments": args}}
        vendor.reply(200, completion({"content": None, "tool_calls": [call]}, "tool_calls"))
        vendor.reply(200, completion({"content": "Four words."}))
        out = _run_program(source, tmp_path, env)
        assert out.strip() == "idle [('word_count', 'completed')]", out
        [result] = _tool_results(env, "word_count")
        assert not result.get("isError") and result["result"]["value"] == {"words": 4}, result
        answered = [m for m in vendor.requests[-1]["body"]["messages"] if m["role"] == "tool"]
        assert [json.loads(m["content"]) for m in answered] == [{"words": 4}], answered

        # Negative control: without the tool in its plugin the worker refuses the same call.
        control = tmp_path / "control"
        (control / "proj").mkdir(parents=True)
        vendor.reply(200, completion({"content": None, "tool_calls": [call]}, "tool_calls"))
        vendor.reply(200, completion({"content": "No tool."}))
        assert "MakaPlugin(tools=[word_count])" in source
        _run_program(source.replace("MakaPlugin(tools=[word_count])", "MakaPlugin()"), control, env)
        results = _tool_results(env, "word_count")
        assert sorted(bool(r.get("isError")) for r in results) == [False, True], results
    finally:
        vendor.httpd.shutdown()


@pytest.mark.temporal
@pytest.mark.slow
def test_the_library_mcp_example_runs(temporal_server: Any, tmp_path: Path, library_home: Path) -> None:
    # The servers file and the script of the MCP page's walk-through.
    servers = {"mcpServers": {"time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]}}}
    (tmp_path / "servers.json").write_text(json.dumps(servers))
    call = {"name": "mcp__time__get_current_time", "args": {"timezone": "Europe/Paris"}}
    (tmp_path / "script.json").write_text(json.dumps({"steps": [{"toolCalls": [call]}, {"text": "done"}]}))
    (tmp_path / "proj").mkdir()
    env = _env(temporal_server, library_home)
    out = _run_program(runnable("library-mcp"), tmp_path, env)
    assert out.strip() == "idle [('mcp__time__get_current_time', 'completed')]", out
    result = _tool_results(env, "mcp__time__get_current_time")[-1]
    assert not result.get("isError") and "Europe/Paris" in json.dumps(result["result"]), result
