"""The ``bash`` tool: one ``/bin/bash -c`` command in the workspace root, inside a sandbox.

A shell command can do anything, so its recovery mode is ``never_auto_retry`` and it has no
reconciler: after a crash between T1 and T2 nobody can tell what it did, and recovery parks.
It heartbeats at least once a second while the command runs, kills the whole process group on
timeout (``tool_timeout``), and keeps at most a bounded amount of output in memory; a result over
the byte limit is ``tool_result_too_large``, never silently truncated.

Every command runs in the bubblewrap sandbox of ``maka_core.tools.sandbox`` (workspace the only
writable place, ledger and ``MAKA_HOME`` hidden, no network unless both keys grant it (the
worker's ``network_permitted`` and the call's ``network_granted``), minimal environment,
own PID namespace so nothing it starts outlives the call), under the resource limits of
``maka_core.tools.bash_limits`` (``bash_resource_limit`` when one is hit), and no git repository it
creates in the workspace survives the call (``maka_core.tools.git_guard``,
``git_repository_refused``). Where no sandbox can be had, ``bash``
is refused (``sandbox_unavailable``) unless the operator opted out with ``unsafe_no_sandbox``;
even then the environment is minimal and the command's process group is killed when it returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from maka_core import failpoints
from maka_core.errors import MakaError
from maka_core.facts.events import RecoveryMode
from maka_core.tools import names
from maka_core.tools.base import (
    DEFAULT_RESULT_BYTE_LIMIT,
    FileEvidence,
    Heartbeat,
    Reconciliation,
    ToolArgs,
    ToolRefusal,
    ToolResult,
    args_schema,
    check_args,
    enforce_result_limit,
)
from maka_core.tools.bash_limits import (
    EXIT_SIGXFSZ,
    BashLimits,
    CallCgroups,
    Enforcement,
    Limit,
    cgroup_parents,
    entering,
    supervised,
    tmp_full,
)
from maka_core.tools.git_guard import GitSurvey, refuse_new, survey
from maka_core.tools.programs import SearchPath
from maka_core.tools.sandbox import (
    SANDBOX_TMP,
    HiddenPathError,
    SandboxStatus,
    bwrap_argv,
    minimal_env,
    plan_hiding,
    sandbox_status,
)

if TYPE_CHECKING:
    from maka_core.governance.classify import Classification
    from maka_core.workspace import Workspace

DEFAULT_TIMEOUT_S = 120.0
HEARTBEAT_INTERVAL_S = 0.5


class _Capture(threading.Thread):
    """Drain one pipe, keeping at most ``cap`` bytes (the rest is counted, not stored)."""

    def __init__(self, stream: IO[bytes], cap: int) -> None:
        super().__init__(daemon=True)
        self.stream, self.cap = stream, cap
        self.data = bytearray()
        self.total = 0

    def run(self) -> None:
        with self.stream:
            while chunk := os.read(self.stream.fileno(), 1 << 16):
                self.total += len(chunk)
                room = self.cap - len(self.data)
                if room > 0:
                    self.data += chunk[:room]


class BashArgs(ToolArgs):
    command: str = Field(description="The bash command line.")


@dataclass(frozen=True)
class BashTool:
    """``bash {command}``: exit code, stdout and stderr; non-zero exit is an error result."""

    #: The argument holding the command line (the worker's denied command patterns judge it).
    command_arg: ClassVar[str] = "command"
    #: A command may touch anything its sandbox lets it: never beside another call of its step.
    parallel: ClassVar[bool] = False

    result_byte_limit: int = DEFAULT_RESULT_BYTE_LIMIT
    timeout_s: float = DEFAULT_TIMEOUT_S
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    # The ledger file and MAKA_HOME: covered inside the sandbox so a command can neither read
    # nor rewrite the authority on tool outcomes.
    hidden_paths: tuple[Path, ...] = ()
    #: The operator's key to the network (``maka worker --bash-network``): without it no call
    #: ever has the network, whatever a policy says.
    network_permitted: bool = False
    #: This call's grant (``with_network``, from the session policy's ``allowNetwork`` as the
    #: decision recorded with T1 says); it counts only together with ``network_permitted``.
    network_granted: bool = False
    # The operator's explicit, loud opt-out (``--unsafe-no-sandbox``): where no sandbox can run,
    # run commands without one instead of refusing them. Where one can run, it is used anyway.
    unsafe_no_sandbox: bool = False
    bwrap: str = "bwrap"
    #: A MELRA terminal task's ``maxOutputChars``: each stream is cut to this many characters and
    #: the result says so (``truncated``), instead of refusing output over the byte limit.
    max_output_chars: int | None = None
    #: Memory, processes, /tmp and file size of one call (``bash_limits``; ``MAKA_BASH_*``).
    limits: BashLimits = field(default_factory=BashLimits)
    _running: set[subprocess.Popen[bytes]] = field(default_factory=set, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    name: ClassVar[str] = names.BASH
    description: ClassVar[str] = (
        "Run a command with /bin/bash -c in the workspace root; returns exitCode, stdout and stderr."
    )
    parameters: ClassVar[dict[str, Any]] = args_schema(BashArgs)
    recovery_mode: ClassVar[RecoveryMode] = "never_auto_retry"
    mutates: ClassVar[bool] = True
    # A command line may read, change or destroy anything the worker can reach.
    effects: ClassVar[frozenset[str]] = frozenset({"read", "mutate", "destructive"})
    #: What a permission request says this call is (``maka.permissionRequest`` ``reason``).
    permission_reason: ClassVar[str] = "shell_dangerous"
    #: The built-in default policy's evidence for a mutating command line (MELRA derives none
    #: for one, which would deny every mutating command): its exit code 0.
    default_evidence: ClassVar[tuple[dict[str, Any], ...]] = ({"type": "exit_code", "value": 0},)

    def __post_init__(self) -> None:
        # Probe at construction (worker start), not at the first call.
        sandbox_status(self.bwrap)
        cgroup_parents()

    @property
    def sandbox(self) -> SandboxStatus:
        """The (cached, probed once per process) sandbox status for this tool's ``bwrap``."""
        return sandbox_status(self.bwrap)

    def with_limits(self, *, timeout_ms: int | None, max_output_chars: int | None) -> BashTool:
        """This tool under a task's own limits: the smaller of the task's and the worker's timeout,
        and the task's output cut. The copy shares the running set, so shutdown still kills it."""
        timeout_s = self.timeout_s if timeout_ms is None else min(self.timeout_s, timeout_ms / 1000)
        return dataclasses.replace(self, timeout_s=timeout_s, max_output_chars=max_output_chars)

    @property
    def network(self) -> bool:
        """Whether this call's sandbox keeps the host's network: both keys, or none."""
        return self.network_permitted and self.network_granted

    def with_network(self, granted: bool) -> BashTool:
        """This tool for one call whose decision did (or did not) grant the network; the copy
        shares the running set, so shutdown still kills it."""
        return self if granted == self.network_granted else dataclasses.replace(self, network_granted=granted)

    def isolation(self) -> str:
        """One line for worker status and logs: how commands run, or why ``bash`` is refused."""
        status = self.sandbox
        if status.available:
            net = (
                "network for sessions whose policy sets allowNetwork (--bash-network)"
                if self.network_permitted
                else "no network"
            )
            return f"{status.describe()}, {net}, {self.enforcement.describe()}"
        if self.unsafe_no_sandbox:
            return (
                f"UNSANDBOXED (unsafe_no_sandbox; {status.reason}): commands can reach everything, "
                f"{self.enforcement.describe()}"
            )
        return f"bash refused: {status.describe()}"

    def _refusal(self) -> ToolRefusal | None:
        status = self.sandbox
        if status.available or self.unsafe_no_sandbox:
            return None
        return ToolRefusal(
            "sandbox_unavailable",
            f"bash runs only in a sandbox and none is available here: {status.reason}",
            reason=status.reason or "",
        )

    def _check_workspace(self, ws: Workspace) -> None:
        if not self.sandbox.available:
            return
        try:
            plan_hiding(ws.root, self.hidden_paths)
        except HiddenPathError as exc:
            raise ToolRefusal("sandbox_unavailable", str(exc), reason=str(exc)) from None

    def _check(self, args: Any) -> str:
        check_args(BashArgs, args, tool=self.name)
        command: str = args["command"]
        if not command.strip():
            raise ToolRefusal("invalid_args", "command must not be empty")
        if "\x00" in command:
            raise ToolRefusal("invalid_args", "command may not contain NUL")
        refusal = self._refusal()
        if refusal is not None:
            raise refusal
        return command

    def search_path(self) -> SearchPath:
        """The PATH a command gets, now (``programs.SearchPath``: no folder inside a workspace or
        one the sandbox replaces or hides); the classifier looks names up in the same value."""
        return SearchPath.current(self.hidden_paths)

    def classify(self, args: dict[str, Any]) -> Classification:
        """A command line is judged by what it runs, not by the tool (``classify_bash``): each
        command word by the program this tool's sandbox would run for it (``search_path``)."""
        # Imported here: governance builds on ``tools.base``, and this module is part of ``tools``.
        from maka_core.governance.classify import classify_bash

        command = args.get("command")
        return classify_bash(command if isinstance(command, str) else "", self.search_path().locate)

    def preflight(self, args: dict[str, Any], ws: Workspace) -> ToolResult | None:
        try:
            self._check(args)
            self._check_workspace(ws)
        except ToolRefusal as refusal:
            return refusal.to_result()
        return None

    def capture_evidence(self, args: dict[str, Any], ws: Workspace) -> FileEvidence | None:
        return None

    def run(self, args: dict[str, Any], ws: Workspace, heartbeat: Heartbeat) -> ToolResult:
        try:
            command = self._check(args)
            self._check_workspace(ws)
        except ToolRefusal as refusal:
            return refusal.to_result()
        failpoints.hit("P3", tag=self.name)
        sandboxed = self.sandbox.available
        # HOME is private: the sandbox's own /tmp, or a fresh directory when unsandboxed.
        home: contextlib.AbstractContextManager[str] = (
            contextlib.nullcontext(SANDBOX_TMP)
            if sandboxed
            else tempfile.TemporaryDirectory(prefix="maka-bash-home-")
        )
        repos = self.git_survey(ws.root)
        try:
            cgroups = CallCgroups.create(self.enforcement)
        except OSError as exc:
            why = f"cannot create the call's cgroups: {exc}"
            return ToolResult.error("sandbox_unavailable", why, reason=why)
        with home as home_dir, contextlib.closing(cgroups):
            report_read, report_write = os.pipe()
            try:
                os.set_blocking(report_read, False)
                try:
                    proc = self._start(command, ws, home_dir, sandboxed, repos, cgroups, report_write)
                except OSError as exc:
                    return ToolResult.error("tool_io_failed", f"cannot start bash: {exc.strerror}")
                finally:
                    os.close(report_write)
                try:
                    outcome = self._wait(proc, heartbeat)
                finally:
                    # Every process of the call is gone (``_wait`` kills and reaps): nothing can
                    # plant a repository behind the check. It runs on cancellation too.
                    planted = self.refuse_git(ws.root, repos)
                hits = self._limits_hit(outcome, cgroups, _read_report(report_read))
            finally:
                os.close(report_read)
        failpoints.hit("P4", tag=self.name)
        result = self._result(outcome, hits)
        return _refused_repositories(result, planted, self.result_byte_limit) if planted else result

    @property
    def enforcement(self) -> Enforcement:
        """How this tool's limits are enforced on this machine (cgroups probed once per process)."""
        limits = self.limits
        if not (self.sandbox.available and self.sandbox.sized_tmp):
            limits = dataclasses.replace(limits, tmp_bytes=None)  # no sized /tmp to give
        return Enforcement.here(limits)

    def git_survey(self, root: Path) -> GitSurvey:
        """The workspace's git repositories before a call: bound read-only inside the sandbox."""
        return survey(root)

    def refuse_git(self, root: Path, before: GitSurvey) -> tuple[str, ...]:
        """Remove the repositories the call created (see ``git_guard``); the paths removed."""
        return refuse_new(root, before)

    def _start(
        self,
        command: str,
        ws: Workspace,
        home: str,
        sandboxed: bool,
        repos: GitSurvey,
        cgroups: CallCgroups,
        report_fd: int,
    ) -> subprocess.Popen[bytes]:
        from maka_core.workspace import MARKER_NAME  # workspace imports tools: not at module level

        env = minimal_env(home, search_path=self.search_path().value)
        argv = supervised(command, cgroups.enforcement, report_fd)
        fds: list[int] = []
        if sandboxed:
            argv, fds = bwrap_argv(
                self.sandbox.bwrap or self.bwrap,
                ws.root,
                argv,
                hidden_paths=self.hidden_paths,
                network=self.network,
                env=env,
                marker_name=MARKER_NAME,
                read_only=repos.read_only,
                tmp_bytes=cgroups.enforcement.limits.tmp_bytes,
            )
        try:
            return subprocess.Popen(
                entering(argv, cgroups),
                cwd=ws.root,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group, so a timeout kills every child
                env=env,
                pass_fds=[*fds, report_fd],
            )
        finally:
            for fd in fds:
                os.close(fd)

    def _wait(self, proc: subprocess.Popen[bytes], heartbeat: Heartbeat) -> _Outcome:
        with self._lock:
            self._running.add(proc)
        assert proc.stdout is not None and proc.stderr is not None
        # Keep one byte over the limit per stream: enough to know the result is too large.
        out, err = (
            _Capture(proc.stdout, self.result_byte_limit + 1),
            _Capture(proc.stderr, self.result_byte_limit + 1),
        )
        out.start()
        err.start()
        deadline = time.monotonic() + self.timeout_s
        timed_out = False
        try:
            while True:
                heartbeat()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    _kill_group(proc)
                    proc.wait()
                    break
                try:
                    proc.wait(timeout=min(self.heartbeat_interval_s, remaining))
                    break
                except subprocess.TimeoutExpired:
                    continue
        except BaseException as exc:
            # The heartbeat raised (cancellation, shutdown): never leave the command running
            # unobserved behind a call that will not report its outcome.
            _kill_group(proc)
            proc.wait()
            if isinstance(exc, MakaError):
                exc.detail.update(_stopped(proc, out, err, self.result_byte_limit))
            raise
        finally:
            with self._lock:
                self._running.discard(proc)
        # Nothing the command started may outlive the call: in the sandbox its PID namespace is
        # gone already; unsandboxed, this reaches background children still in its group.
        _kill_group(proc)
        # Background children that kept the pipes open must not hold the result hostage.
        grace = time.monotonic() + 1.0
        for capture in (out, err):
            capture.join(timeout=max(0.0, grace - time.monotonic()))
        if out.is_alive() or err.is_alive():
            _kill_group(proc)
            out.join()
            err.join()
        return _Outcome(proc.returncode, out, err, timed_out)

    def _limits_hit(self, outcome: _Outcome, cgroups: CallCgroups, report: bytes) -> list[Limit]:
        hits = cgroups.hit()
        if cgroups.enforcement.limits.tmp_bytes is not None and tmp_full(report):
            hits.append("tmp_size")
        if self.limits.file_bytes is not None and outcome.returncode == EXIT_SIGXFSZ:
            hits.append("file_size")
        return hits

    def _result(self, outcome: _Outcome, hits: list[Limit]) -> ToolResult:
        out, err, returncode = outcome.out, outcome.err, outcome.returncode
        if hits:
            said: dict[str, Any] = {"exitCode": returncode, "timedOut": outcome.timed_out or None}
            limits = {hit: self.limits.value(hit) for hit in hits}
            message = "the command hit the sandbox's " + ", ".join(
                f"{k} limit ({v})" for k, v in limits.items()
            )
            refused = ToolResult.error(
                "bash_resource_limit",
                message,
                limit=hits[0],
                limits=limits,
                **said,
                stdout=_text(out),
                stderr=_text(err),
            )
            if refused.serialized_size() > self.result_byte_limit:
                refused = ToolResult.error(
                    "bash_resource_limit", message, limit=hits[0], limits=limits, **said
                )
            return refused
        if outcome.timed_out:
            return ToolResult.error(
                "tool_timeout",
                f"the command did not finish within {self.timeout_s:g} s",
                timeoutSeconds=self.timeout_s,
            )
        clipped = None if self.max_output_chars is None else _clip(out, err, self.max_output_chars)
        if clipped is None and (out.total > self.result_byte_limit or err.total > self.result_byte_limit):
            return ToolResult.error(
                "tool_result_too_large",
                f"output is {out.total} bytes of stdout and {err.total} of stderr, over the "
                f"{self.result_byte_limit}-byte limit; redirect it to a file or ask for less",
                size=out.total + err.total,
                limit=self.result_byte_limit,
                exitCode=returncode,
            )
        value: dict[str, Any] = {
            "exitCode": returncode,
            "stdout": _text(out),
            "stderr": _text(err),
        }
        if clipped is not None:
            value.update(clipped)
        result = ToolResult.json(value, is_error=returncode != 0)
        limited = enforce_result_limit(result, self.result_byte_limit)
        if limited is not result:
            limited = ToolResult.error(
                "tool_result_too_large",
                f"the result is {result.serialized_size()} bytes, over the "
                f"{self.result_byte_limit}-byte limit",
                size=result.serialized_size(),
                limit=self.result_byte_limit,
                exitCode=returncode,
            )
        return limited

    def reconcile(
        self, args: dict[str, Any], ws: Workspace, evidence: FileEvidence | None
    ) -> Reconciliation | None:
        return None  # no way to observe what an arbitrary command did: recovery parks

    def kill_running(self) -> int:
        """SIGKILL every command this tool is running (worker shutdown); returns how many."""
        with self._lock:
            procs = list(self._running)
        for proc in procs:
            _kill_group(proc)
        return len(procs)


def _refused_repositories(result: ToolResult, planted: tuple[str, ...], limit: int) -> ToolResult:
    """The call's result as ``git_repository_refused``: what was removed, and what the command
    said (its output only while the result stays within the byte limit)."""
    value = result.result.get("value") if isinstance(result.result, dict) else None
    said = dict(value) if isinstance(value, dict) else {}
    if "code" in said:
        said["commandCode"] = said.pop("code")
        said.pop("message", None)
    message = (
        "bash may not create git repositories in the workspace (the operator's git would run "
        f"their configuration on the host); removed: {', '.join(planted)}"
    )
    refused = ToolResult.error("git_repository_refused", message, paths=list(planted), **said)
    if refused.serialized_size() > limit:
        said = {k: v for k, v in said.items() if k not in ("stdout", "stderr")}
        refused = ToolResult.error("git_repository_refused", message, paths=list(planted), **said)
    return refused


@dataclass(frozen=True)
class _Outcome:
    returncode: int
    out: _Capture
    err: _Capture
    timed_out: bool


def _read_report(fd: int) -> bytes:
    """What the supervisor reported (non-blocking: a leftover writer must not hold the call)."""
    try:
        return os.read(fd, 4096)
    except (BlockingIOError, OSError):
        return b""


def _text(capture: _Capture) -> str:
    return bytes(capture.data).decode("utf-8", errors="replace")


def _clip(out: _Capture, err: _Capture, limit: int) -> dict[str, Any] | None:
    """Both streams cut to ``limit`` characters, with what was cut (MELRA's ``truncated``); None
    when a stream is over the worker's byte limit before it reaches ``limit`` characters (the
    worker's limit is then the smaller one, and it refuses as usual)."""
    value: dict[str, Any] = {"truncated": False}
    for key, capture in (("stdout", out), ("stderr", err)):
        text = _text(capture)
        # The capture keeps one byte past the limit; the character it may split lies past ``limit``.
        if len(text) > limit:
            value[key] = text[:limit]
            value["truncated"] = True
            value.setdefault("truncatedStreams", []).append(key)
        elif capture.total > len(capture.data):
            return None
        else:
            value[key] = text
    if value["truncated"]:
        value["maxOutputChars"] = limit
    return value


def _stopped(proc: subprocess.Popen[bytes], out: _Capture, err: _Capture, limit: int) -> dict[str, Any]:
    """What a command stopped by its call's cancellation was seen to do: the signal that ended it
    and the output it wrote until then (each stream cut to a quarter of the result limit), for a
    cancellation whose end is recorded (``runtime.tool_effect``: ``tool_cancelled``)."""
    for capture in (out, err):
        capture.join(timeout=0.5)
    code = proc.returncode
    seen: dict[str, Any] = {"exitSignal": signal.Signals(-code).name} if code is not None and code < 0 else {}
    if code is not None and code >= 0:
        seen["exitCode"] = code
    keep = max(1, limit // 4)
    for key, capture in (("stdout", out), ("stderr", err)):
        text = _text(capture)
        seen[key] = text[:keep]
        if len(text) > keep or capture.total > len(capture.data):
            seen[f"{key}Truncated"] = True
    return seen


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
