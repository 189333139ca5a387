"""How a stdio MCP server is started: from a program outside every workspace, ending with its
worker, and, when it serves one session's workspace, inside the same sandbox as ``bash``.

The servers file names a program (``command``); a workspace is written by the model. So:

- **The program is pinned when the worker starts** (``pin_command``): an absolute path outside every
  workspace, or a bare name found on the sandbox's search path (``tools.programs.SearchPath``:
  the worker's ``PATH`` without its empty, relative and in-workspace folders) whose real file is
  outside them too. Anything else (a relative
  path such as ``./server.py``, a name found only in a workspace) refuses the servers file,
  ``mcp_config_invalid``. A restarted server runs the pinned program again, never a new lookup.
- **Its interpreter takes nothing from the folder it runs in**: ``PYTHONSAFEPATH=1`` (Python puts
  neither the working folder nor a script's folder first on ``sys.path``, so a ``mcp/`` package or
  a ``server.py`` the model wrote beside it is not imported), and the ``PYTHONPATH`` / ``NODE_PATH``
  entries a servers file gives are kept only when absolute and outside every workspace. A package
  runner that resolves programs from the working folder first (``npx``, ``pnpm dlx``, ``bunx``,
  ``uvx``) is refused for a session-scoped server: install the server and name its program.
- **A session-scoped server runs in the bash sandbox** (``tools.sandbox.bwrap_argv``): the root
  filesystem read-only, the session's workspace the only writable place (its git repositories and
  marker read-only), a private ``/tmp``, a fresh ``/proc`` (none of the worker's processes), no
  network unless its entry says ``"network": true``, and an environment of ``PATH``, ``HOME``,
  ``LANG``, ``TERM`` and its entry's own ``env`` only. Where no sandbox can run, it is not started
  (its calls are refused ``mcp_server_unavailable``) unless the worker runs ``--unsafe-no-sandbox``.
- **A worker-scoped server** (the operator's, reaching what the operator gave it) runs on the host,
  in its entry's ``cwd`` or else a private empty folder (never the worker's own), with the MCP
  SDK's short list of inherited variables (``HOME``, ``LOGNAME``, ``PATH`` as above, ``SHELL``,
  ``TERM``, ``USER``) and its entry's ``env``: none of the worker's secrets (provider keys, database
  URLs) reach it.
- **Every server ends with its worker**, however the worker ends: a sandboxed one through bwrap's
  ``--die-with-parent`` (its whole PID namespace goes with it), a host one through a parent-death
  signal (``PR_SET_PDEATHSIG``: ``SIGKILL``) set by a small prelude before it runs the program. The
  signal is tied to the thread that started the server: the servers' own loop thread, which lives
  as long as the worker serves them. A worker that starts up kills nothing.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

from maka_core.errors import ConfigError
from maka_core.tools.beneath import MARKER_NAME
from maka_core.tools.git_guard import survey
from maka_core.tools.mcp.config import StdioServer
from maka_core.tools.programs import SearchPath, in_workspace
from maka_core.tools.sandbox import SANDBOX_TMP, bwrap_argv, minimal_env, sandbox_status

#: Package runners that look for the program in the working folder's ``node_modules`` (or a
#: project file) first: a session-scoped server would run what the model wrote there.
PACKAGE_RUNNERS: Final = frozenset({"npx", "pnpx", "pnpm", "bunx", "bun", "uvx", "yarn"})
#: Search-path variables an interpreter takes code from: only absolute entries outside every
#: workspace are kept.
SEARCH_PATHS: Final = ("PYTHONPATH", "NODE_PATH")
#: Runs the program with ``PR_SET_PDEATHSIG`` = ``SIGKILL`` (``prctl`` option 1), after checking
#: that its parent (argv[1]) has not already gone: then it would never be signalled.
_PRELUDE: Final = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def pin_command(name: str, server: StdioServer) -> str:
    """The real file ``server``'s ``command`` runs (see the module docstring).

    Raises:
        ConfigError: ``mcp_config_invalid`` (``field``: ``mcpServers.<name>.command``).
    """
    command = server.command
    where = f"mcpServers.{name}.command"

    def refuse(why: str) -> ConfigError:
        return ConfigError("mcp_config_invalid", f"{where}: {why}", field=where)

    if os.path.isabs(command):
        if in_workspace(os.path.realpath(command)):
            raise refuse(f"{command} is inside a workspace: the model could rewrite it")
        return command
    if "/" in command:
        raise refuse(f"{command!r} is a relative path: give an absolute path or a program on PATH")
    search = SearchPath.current()
    if search.locate(command).place != "system":
        raise refuse(f"no program {command!r} on the worker's PATH outside every workspace")
    # The path as found, not its real file: a venv's ``python`` is a symlink whose own place
    # tells it its environment.
    found = shutil.which(command, path=search.value)
    assert found is not None
    if server.scope == "session" and os.path.basename(command) in PACKAGE_RUNNERS:
        raise refuse(
            f"{command} resolves programs from the workspace first: install the server and name its program"
        )
    return found


def _search_paths(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with its interpreters' search paths cut down to absolute folders outside every
    workspace, and Python told not to put the working or script folder first (``-P``)."""
    out = dict(env)
    for key in SEARCH_PATHS:
        if key in out:
            kept = [
                p
                for p in out[key].split(os.pathsep)
                if os.path.isabs(p) and not in_workspace(os.path.realpath(p))
            ]
            out[key] = os.pathsep.join(kept)
    out["PYTHONSAFEPATH"] = "1"
    return out


def host_argv(command: str, args: Iterable[str]) -> list[str]:
    """The argv of a worker-scoped server: the prelude that ties it to the worker, then it."""
    return [sys.executable, "-I", "-c", _PRELUDE, str(os.getpid()), command, *args]


def host_env(server: StdioServer) -> dict[str, str]:
    """What a worker-scoped server is given besides the SDK's inherited variables: ``PATH`` without
    workspace folders, its entry's ``env``, and the interpreters' search paths made safe."""
    given = {k: v.get_secret_value() for k, v in server.env.items()}
    return _search_paths({"PATH": SearchPath.current().value, **given})


class SandboxUnavailable(RuntimeError):
    """A session-scoped server cannot be sandboxed here (and the worker is not ``--unsafe-no-sandbox``)."""


def sandboxed_argv(
    command: str,
    args: Iterable[str],
    server: StdioServer,
    root: Path,
    *,
    hidden_paths: Iterable[Path] = (),
) -> list[str]:
    """The argv of a session-scoped server over ``root`` (its workspace, or the empty folder it
    lists its tools in), inside the bash sandbox.

    Raises:
        SandboxUnavailable: bwrap cannot run a sandbox here.
    """
    status = sandbox_status()
    if not status.available or status.bwrap is None:
        raise SandboxUnavailable(f"a session-scoped MCP server runs only in the sandbox: {status.reason}")
    given = {k: v.get_secret_value() for k, v in server.env.items()}
    env = _search_paths({**minimal_env(SANDBOX_TMP), **given})
    argv, fds = bwrap_argv(
        status.bwrap,
        root,
        [command, *args],
        # What does not exist holds nothing to hide (a worker's MAKA_HOME not made yet); hidden as
        # bash hides it, its parent would be, and an interpreter under it (``~/.pyenv``) with it.
        hidden_paths=[p for p in hidden_paths if os.path.lexists(p)],
        network=server.network,
        env=env,
        marker_name=MARKER_NAME,
        read_only=survey(root).read_only,
        fd_free=True,
    )
    assert not fds  # fd_free: a server's process is started by the SDK, which passes no fds
    return argv
