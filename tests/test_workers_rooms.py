"""``workers/`` is four rooms (``cli``, ``host``, ``client``, ``console``) with no import circle among its
modules, and the CLI holds no decision the other rooms own.

The import graph is read with ``ast`` from the source, every import counted wherever it sits
(module level, inside a function, under ``TYPE_CHECKING``): a function-local circle is still a
circle, only hidden until the function runs. Each checker is shown, on a small package built in
``tmp_path``, to find what it looks for (the negative controls).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

WORKERS = Path(__file__).resolve().parent.parent / "workers"
PACKAGE = "maka_temporal.workers"
ROOMS = ("cli", "client", "console", "host")

#: The decisions that belong to the host or the client, by the function that makes each: none may
#: be defined in a CLI module.
DECISIONS = {
    "resume_lost_session": "host",
    "settle_lost_runs": "host",
    "lost_sessions": "host",
    "startup_repair": "host",
    "reopen": "client",
    "check_session_known": "client",
    "answer_approval": "client",
    "session_policy": "client",
    "governance_status": "client",
}

#: maka_core's deciding modules (recovery, continuation, approvals, resolution): the CLI reaches
#: them through the client or the host, never directly.
DECIDING_MODULES = (
    "maka_core.runtime.approvals",
    "maka_core.runtime.continuation",
    "maka_core.runtime.lost_run",
    "maka_core.runtime.resolution",
    "maka_core.runtime.settle",
)

#: What the CLI reaches only through ``SessionClient`` (resume with its fence, audit, follow): the
#: command and the library answer alike because there is one path (modules under the package).
THROUGH_THE_CLIENT = ("host.resume", "host.attempt_fence", "client.audit", "client.session_follow")

#: The only function-local imports outside the CLI (whose command boundary is lazy, ``cli/__init__``):
#: module -> the prefixes it may import late, each for the reason its module says.
LAZY = {
    # The Temporal side (``status``, ``reopen`` import it) and, for ``resume``, the host
    # (``client.resume`` imports it): ledger-only calls start without the SDK.
    "client.session_api": (
        "maka_temporal.workers.client.session_client",
        "maka_temporal.workers.client.turn_messages",
        "maka_temporal.workers.client.connect",
        "maka_temporal.workers.client.audit",
        "maka_temporal.workers.client.status",
        "maka_temporal.workers.client.reopen",
        "maka_temporal.workers.client.resume",
        "maka_temporal.workers.client.wake",  # a resolution's wake-up, once the ledger has it
    ),
    # The approve/deny Update, only when the ledger knows the session and a server is connected.
    "client.approval_answers": ("maka_temporal.workers.client.turn_messages",),
    # The SDK's task-queue description, only when a start waits long or a status finds no answer:
    # ``maka session show`` imports this module and runs without the SDK (``test_cli_startup``).
    "client.pollers": ("temporalio.api.",),
    "host.worker": ("maka_core.tools.mcp.",),  # the MCP SDK, only when an MCP config is given
    "host.telemetry": ("opentelemetry.exporter.",),  # the OTLP exporter, only when an endpoint is set
}


def modules_of(root: Path, package: str) -> dict[str, Path]:
    """Every module under ``root`` (a package folder) by its dotted name under ``package``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([package, *parts])] = path
    return out


def imports_of(path: Path, name: str, is_package: bool) -> set[str]:
    """The dotted names ``path`` imports, anywhere in it (relative imports resolved); for ``from
    X import y`` both ``X`` and ``X.y`` (``y`` may be a module)."""
    here = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    modules = modules_of(root, package)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        seen = imports_of(path, name, path.name == "__init__.py")
        # Importing a.b.c runs a/__init__ and a/b/__init__ too: the parents are edges as well.
        targets = {t for s in seen for t in _with_parents(s)}
        graph[name] = {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
    return graph


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (its modules, first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def room_of(module: str, package: str) -> str | None:
    rest = module.removeprefix(package + ".").split(".")
    return rest[0] if rest[0] in ROOMS and len(rest) > 1 else None


def cli_decisions(root: Path, package: str) -> list[str]:
    """What a CLI module does that is another room's: a deciding function defined in it, a deciding
    maka_core module imported by it, or (the other way round) a host or client module importing
    the CLI."""
    found = []
    modules = modules_of(root, package)
    for name, path in modules.items():
        room = room_of(name, package)
        imported = imports_of(path, name, path.name == "__init__.py")
        if room == "cli":
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in DECISIONS:
                    found.append(f"{name} defines {node.name} (the {DECISIONS[node.name]}'s)")
            found += [f"{name} imports {m}" for m in sorted(imported) if m in DECIDING_MODULES]
            through = {f"{package}.{m}" for m in THROUGH_THE_CLIENT}
            found += [f"{name} imports {m} (not through SessionClient)" for m in sorted(imported & through)]
        elif room is not None:
            cli = [m for m in sorted(imported) if m in modules and room_of(m, package) == "cli"]
            found += [f"{name} imports {m}" for m in cli]
    return found


def late_imports(root: Path, package: str, allowed: dict[str, tuple[str, ...]]) -> list[str]:
    """The function-local imports outside the CLI room that ``allowed`` does not name."""
    found = []
    for name, path in modules_of(root, package).items():
        if room_of(name, package) == "cli":
            continue
        ok = allowed.get(name.removeprefix(package + "."), ())
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom):
                    targets = [f"{node.module}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                else:
                    continue
                found += [f"{name}:{node.lineno} {t}" for t in targets if not t.startswith(ok)]
    return sorted(set(found))


def test_imports_are_at_module_level_but_where_declared() -> None:
    assert late_imports(WORKERS, PACKAGE, LAZY) == []
    # The declared ones are real: each module does import late what it is allowed to.
    assert late_imports(WORKERS, PACKAGE, {}) != []
    late = {f.split(":")[0].removeprefix(PACKAGE + ".") for f in late_imports(WORKERS, PACKAGE, {})}
    assert late == set(LAZY)


def test_negative_control_a_late_import_is_found(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "cli/__init__.py": "",
            "client/__init__.py": "",
            "cli/run.py": "def cmd():\n    from pkg.client import calls\n",  # the CLI's boundary: allowed
            "client/calls.py": "import json\ndef go():\n    import asyncio\n    from pkg.client import x\n",
        },
    )
    assert late_imports(pkg, "pkg", {}) == ["pkg.client.calls:3 asyncio", "pkg.client.calls:4 pkg.client.x"]
    assert late_imports(pkg, "pkg", {"client.calls": ("asyncio", "pkg.client.")}) == []


def registrations(path: Path) -> list[str]:
    """The ways a CLI module registers a command other than the one way (a plain
    ``@click.command``/``@click.group``, named once in ``add_commands`` or ``app.COMMANDS``): a
    ``@group.command`` decorator or an ``add_command`` call of its own."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for deco in node.decorator_list:
                call = deco.func if isinstance(deco, ast.Call) else deco
                if (
                    isinstance(call, ast.Attribute)
                    and call.attr in ("command", "group")
                    and not (isinstance(call.value, ast.Name) and call.value.id == "click")
                ):
                    found.append(f"{path.name}:{deco.lineno} @{ast.unparse(call)}")
        func = node.func if isinstance(node, ast.Call) else None
        if isinstance(func, ast.Attribute) and func.attr == "add_command":
            found.append(f"{path.name}:{node.lineno} {ast.unparse(func)}")
    return found


def test_one_way_to_register_a_command() -> None:
    found = [r for p in sorted((WORKERS / "cli").glob("*.py")) for r in registrations(p)]
    # The two add_command calls are the one way itself: app's lazy root group and base.add_commands.
    assert [r.split(" ", 1)[1] for r in found] == ["self.add_command", "group.add_command"], found
    assert [r.split(":")[0] for r in found] == ["app.py", "base.py"], found


def test_negative_control_a_second_way_is_found(tmp_path: Path) -> None:
    module = tmp_path / "session.py"
    module.write_text(
        "import click\n@click.group('session')\ndef session(): pass\n"
        "@session.command('start')\ndef cmd_start(): pass\n"
        "session.add_command(cmd_start)\n"
    )
    assert registrations(module) == ["session.py:4 @session.command", "session.py:6 session.add_command"]


def test_workers_modules_import_no_circle() -> None:
    graph = import_graph(WORKERS, PACKAGE)
    # The graph is the real one: the rooms' modules are in it and their known edges are seen.
    assert {room_of(m, PACKAGE) for m in graph} >= set(ROOMS)
    assert f"{PACKAGE}.host.worker" in graph[f"{PACKAGE}.host.plugin"]
    assert f"{PACKAGE}.host.plugin" in graph[f"{PACKAGE}.host.serve"]
    assert f"{PACKAGE}.client.resume" in graph[f"{PACKAGE}.client.session_api"]  # a function-local one
    assert f"{PACKAGE}.host.worker" in graph[f"{PACKAGE}.client.resume"]
    assert find_cycle(graph) is None, f"import circle: {' -> '.join(find_cycle(graph) or [])}"


def test_every_workers_module_is_in_a_room_with_a_public_face() -> None:
    modules = modules_of(WORKERS, PACKAGE)
    loose = [m for m in modules if m != PACKAGE and room_of(m, PACKAGE) is None and m.count(".") > 2]
    assert loose == [], loose
    assert sorted(p.name for p in WORKERS.glob("*.py")) == ["__init__.py"], "a module outside the rooms"
    for room in ROOMS:
        init = ast.parse((WORKERS / room / "__init__.py").read_text(encoding="utf-8"))
        declared = next(
            ast.literal_eval(n.value)
            for n in init.body
            if isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["__all__"]
        )
        present = sorted(p.stem for p in (WORKERS / room).glob("*.py") if p.stem != "__init__")
        assert sorted(declared) == present, room


def test_the_cli_decides_nothing_another_room_owns() -> None:
    assert cli_decisions(WORKERS, PACKAGE) == []
    defined = {
        node.name: room_of(name, PACKAGE)
        for name, path in modules_of(WORKERS, PACKAGE).items()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in DECISIONS
    }
    assert defined == DECISIONS  # each decision exists, in the room that owns it


def _package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "pkg"
    for rel, text in {"__init__.py": "", **files}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    return pkg


@pytest.mark.parametrize(
    "b_imports_a",
    [
        "from pkg.cli.a import x\n",  # at module level
        "def late():\n    from pkg.cli import a\n",  # function-local: the plugin<->worker shape
        "def late():\n    from ..cli.a import x\n",  # relative
    ],
)
def test_negative_control_a_circle_is_found(tmp_path: Path, b_imports_a: str) -> None:
    pkg = _package(
        tmp_path,
        {
            "cli/__init__.py": "",
            "host/__init__.py": "",
            "cli/a.py": "from pkg.host.b import y\nx = 1\n",
            "host/b.py": b_imports_a + "y = 2\n",
            "host/c.py": "from pkg.host import b\n",
        },
    )
    cycle = find_cycle(import_graph(pkg, "pkg"))
    assert cycle is not None and set(cycle) == {"pkg.cli.a", "pkg.host.b"}, cycle
    # Without the edge back, the same checker sees none.
    (pkg / "host" / "b.py").write_text("y = 2\n")
    assert find_cycle(import_graph(pkg, "pkg")) is None


def test_negative_control_a_decision_in_the_cli_is_found(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "cli/__init__.py": "",
            "host/__init__.py": "",
            "client/__init__.py": "",
            "cli/resume.py": "async def resume_lost_session():\n    pass\n",
            "cli/session.py": "def cmd():\n    from maka_core.runtime import approvals\n",
            "host/worker.py": "from pkg.cli.resume import resume_lost_session\n",
            "client/ok.py": "from pkg.host import worker\n",
        },
    )
    assert cli_decisions(pkg, "pkg") == [
        "pkg.cli.resume defines resume_lost_session (the host's)",
        "pkg.cli.session imports maka_core.runtime.approvals",
        "pkg.host.worker imports pkg.cli.resume",
    ]


def test_negative_control_the_cli_going_around_the_session_client_is_found(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "cli/__init__.py": "",
            "host/__init__.py": "",
            "client/__init__.py": "",
            "host/resume.py": "def go():\n    pass\n",
            "client/session_api.py": "from pkg.host.resume import go\n",
            "cli/resume.py": "from pkg.host.resume import go\n",
        },
    )
    assert cli_decisions(pkg, "pkg") == ["pkg.cli.resume imports pkg.host.resume (not through SessionClient)"]
    (pkg / "cli" / "resume.py").write_text("from pkg.client.session_api import go\n")
    assert cli_decisions(pkg, "pkg") == []
