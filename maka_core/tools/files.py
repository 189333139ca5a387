"""The file tools: ``read_file``, ``list_dir``, ``write_file`` and ``edit_file``.

Reads are ``replay_safe``. Writes are ``reconcile``: before T1 they record the file's before and
expected-after identity (``FileEvidence``), and they replace the file atomically (temporary file
in the same directory, fsync, rename, fsync the directory), so after a crash the file holds either
the before or the expected-after bytes and the reconciler can tell which without writing.
Every path goes through ``Workspace.resolve``; a refusal is an ordinary error result.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, ParamSpec

from maka_core import failpoints
from maka_core.facts.codec import canonical_args_hash
from maka_core.facts.events import RecoveryMode
from maka_core.tools import effect_journal
from maka_core.tools.base import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_RESULT_BYTE_LIMIT,
    FileEvidence,
    FileIdentity,
    Heartbeat,
    Reconciliation,
    ToolRefusal,
    ToolResult,
    check_args,
    enforce_result_limit,
)
from maka_core.tools.evidence import reconcile_file

if TYPE_CHECKING:
    from maka_core.workspace import Workspace

P = ParamSpec("P")
_PATH_SCHEMA = {"type": "string", "description": "Path relative to the workspace root."}


def read_regular(path: Path, max_bytes: int) -> bytes:
    """The bytes of a regular file, without following a final symlink, at most ``max_bytes``.

    Raises:
        ToolRefusal: ``file_not_found``, ``not_a_file``, ``file_too_large``, ``tool_io_failed``.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ToolRefusal("file_not_found", "no such file", path=str(path)) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ToolRefusal("not_a_file", "the path is a symlink", path=str(path)) from None
        if exc.errno == errno.EISDIR:
            raise ToolRefusal("not_a_file", "the path is a directory", path=str(path)) from None
        raise ToolRefusal("tool_io_failed", f"cannot open: {exc.strerror}", path=str(path)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ToolRefusal("not_a_file", "not a regular file", path=str(path))
        if st.st_size > max_bytes:
            raise ToolRefusal("file_too_large", f"{st.st_size} bytes, over {max_bytes}", path=str(path))
        chunks: list[bytes] = []
        total = 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > max_bytes:  # grew since fstat
                raise ToolRefusal("file_too_large", f"over {max_bytes} bytes", path=str(path))
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise ToolRefusal("tool_io_failed", f"cannot read: {exc.strerror}", path=str(path)) from None
    finally:
        os.close(fd)


def decode_text(data: bytes, path: str) -> str:
    """UTF-8 text or ``ToolRefusal(file_not_text)``."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolRefusal("file_not_text", "the file is not UTF-8 text", path=path) from None


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically: temp file in the same directory, fsync, rename,
    fsync the directory. A crash leaves the old bytes or the new ones, never a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = 0o644
    with contextlib.suppress(FileNotFoundError):
        mode = stat.S_IMODE(os.lstat(path).st_mode)
    tmp = path.with_name(f".{path.name}.maka-{uuid.uuid4().hex[:12]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)  # the umask must not change an existing file's mode
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _refused(fn: Callable[P, ToolResult]) -> Callable[P, ToolResult]:
    """Turn a ToolRefusal raised by ``fn`` into its error result: refusals never escape a tool."""

    @functools.wraps(fn)
    def wrapper(*a: P.args, **kw: P.kwargs) -> ToolResult:
        try:
            return fn(*a, **kw)
        except ToolRefusal as refusal:
            return refusal.to_result()

    return wrapper


@dataclass(frozen=True)
class _FileTool:
    """Shared configuration of the file tools."""

    result_byte_limit: int = DEFAULT_RESULT_BYTE_LIMIT
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES


# --- read tools ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _ReadTool(_FileTool):
    """A read-only tool on one workspace path: no evidence, and re-reading is its recovery."""

    name: ClassVar[str]
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"path": _PATH_SCHEMA},
        "required": ["path"],
        "additionalProperties": False,
    }
    recovery_mode: ClassVar[RecoveryMode] = "replay_safe"
    mutates: ClassVar[bool] = False
    effects: ClassVar[frozenset[str]] = frozenset({"read"})

    def preflight(self, args: dict[str, Any], ws: Workspace) -> ToolResult | None:
        try:
            check_args(args, {"path": str}, tool=self.name)
            ws.resolve(args["path"])
        except ToolRefusal as refusal:
            return refusal.to_result()
        return None

    def capture_evidence(self, args: dict[str, Any], ws: Workspace) -> FileEvidence | None:
        return None

    def reconcile(
        self, args: dict[str, Any], ws: Workspace, evidence: FileEvidence | None
    ) -> Reconciliation | None:
        return None  # replay_safe: nothing to settle


@dataclass(frozen=True)
class ReadFileTool(_ReadTool):
    name: ClassVar[str] = "read_file"
    description: ClassVar[str] = "Read a UTF-8 text file in the workspace and return its content."

    @_refused
    def run(self, args: dict[str, Any], ws: Workspace, heartbeat: Heartbeat) -> ToolResult:
        check_args(args, {"path": str}, tool=self.name)
        failpoints.hit("P3", tag=self.name)
        path = ws.resolve(args["path"])
        # Read one byte past what could fit so an oversized file is refused, not truncated.
        limit = min(self.max_file_bytes, self.result_byte_limit)
        try:
            data = read_regular(path, limit)
        except ToolRefusal as refusal:
            if refusal.code != "file_too_large":
                raise
            return ToolResult.error(
                "tool_result_too_large",
                f"{args['path']} is over the {limit}-byte result limit",
                limit=limit,
            )
        result = ToolResult.text(decode_text(data, args["path"]))
        failpoints.hit("P4", tag=self.name)
        return enforce_result_limit(result, self.result_byte_limit)


@dataclass(frozen=True)
class ListDirTool(_ReadTool):
    name: ClassVar[str] = "list_dir"
    description: ClassVar[str] = (
        "List a directory in the workspace: each entry's name, type (file, dir, symlink, other) "
        "and size for files. Use '.' for the workspace root."
    )

    @_refused
    def run(self, args: dict[str, Any], ws: Workspace, heartbeat: Heartbeat) -> ToolResult:
        check_args(args, {"path": str}, tool=self.name)
        failpoints.hit("P3", tag=self.name)
        path = ws.resolve(args["path"])
        entries: list[dict[str, Any]] = []
        try:
            with os.scandir(path) as it:
                for entry in it:
                    if entry.is_symlink():
                        entries.append({"name": entry.name, "type": "symlink"})
                    elif entry.is_dir(follow_symlinks=False):
                        entries.append({"name": entry.name, "type": "dir"})
                    elif entry.is_file(follow_symlinks=False):
                        size = entry.stat(follow_symlinks=False).st_size
                        entries.append({"name": entry.name, "type": "file", "size": size})
                    else:
                        entries.append({"name": entry.name, "type": "other"})
        except FileNotFoundError:
            raise ToolRefusal("file_not_found", "no such directory", path=args["path"]) from None
        except NotADirectoryError:
            raise ToolRefusal("not_a_directory", "not a directory", path=args["path"]) from None
        except OSError as exc:
            raise ToolRefusal("tool_io_failed", f"cannot list: {exc.strerror}", path=args["path"]) from None
        entries.sort(key=lambda e: e["name"])
        result = ToolResult.json({"path": ws.relative(path), "entries": entries})
        failpoints.hit("P4", tag=self.name)
        return enforce_result_limit(result, self.result_byte_limit)

    def reconcile(
        self, args: dict[str, Any], ws: Workspace, evidence: FileEvidence | None
    ) -> Reconciliation | None:
        return None


# --- write tools ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    path: Path
    target: str  # canonical relative path
    before: bytes | None
    after: bytes


class _WriteTool(_FileTool):
    """A tool that replaces one file's bytes: plan (pure), evidence, atomic write, reconcile."""

    name: ClassVar[str]
    transform: ClassVar[str]
    recovery_mode: ClassVar[RecoveryMode] = "reconcile"
    mutates: ClassVar[bool] = True
    effects: ClassVar[frozenset[str]] = frozenset({"mutate"})
    captures_evidence: ClassVar[bool] = True  # policy: a reconcile-mode mutation needs evidence

    def _plan(self, args: Any, ws: Workspace) -> _Plan:
        raise NotImplementedError

    def _read_before(self, path: Path, rel: str) -> bytes | None:
        try:
            return read_regular(path, self.max_file_bytes)
        except ToolRefusal as refusal:
            if refusal.code == "file_not_found":
                return None
            raise ToolRefusal(refusal.code, refusal.message, path=rel) from None

    def result_for(self, target: str, after: FileIdentity) -> ToolResult:
        """The result of a successful call; recovery rebuilds the same value from the evidence."""
        return ToolResult.json({"path": target, "bytes": after.size, "sha256": after.sha256})

    def preflight(self, args: dict[str, Any], ws: Workspace) -> ToolResult | None:
        try:
            self._plan(args, ws)
        except ToolRefusal as refusal:
            return refusal.to_result()
        return None

    def capture_evidence(self, args: dict[str, Any], ws: Workspace) -> FileEvidence | None:
        """Evidence for T1. Raises ``ToolRefusal`` if the file changed since preflight so that the
        call no longer applies (treat it like a preflight refusal: nothing was dispatched)."""
        plan = self._plan(args, ws)
        return FileEvidence(
            workspace_identity=ws.identity,
            target=plan.target,
            before=None if plan.before is None else FileIdentity.of(plan.before),
            expected_after=FileIdentity.of(plan.after),
            transform=self.transform,
            max_bytes=self.max_file_bytes,
            tool_name=self.name,
            args_hash=canonical_args_hash(self.name, args),
        )

    @_refused
    def run(self, args: dict[str, Any], ws: Workspace, heartbeat: Heartbeat) -> ToolResult:
        failpoints.hit("P3", tag=self.name)
        plan = self._plan(args, ws)
        try:
            atomic_write(plan.path, plan.after)
        except OSError as exc:
            raise ToolRefusal("tool_io_failed", f"cannot write: {exc.strerror}", path=plan.target) from None
        effect_journal.record(self.name, plan.path, plan.after)  # drills only (MAKA_EFFECT_LOG)
        failpoints.hit("P4", tag=self.name)
        return enforce_result_limit(
            self.result_for(plan.target, FileIdentity.of(plan.after)), self.result_byte_limit
        )

    def reconcile(
        self, args: dict[str, Any], ws: Workspace, evidence: FileEvidence | None
    ) -> Reconciliation | None:
        return reconcile_file(
            self.name,
            args,
            ws,
            evidence,
            lambda ev: enforce_result_limit(
                self.result_for(ev.target, ev.expected_after), self.result_byte_limit
            ),
        )


@dataclass(frozen=True)
class WriteFileTool(_WriteTool):
    name: ClassVar[str] = "write_file"
    transform: ClassVar[str] = "write_file/v1"
    description: ClassVar[str] = (
        "Create or replace a UTF-8 text file in the workspace with the given content "
        "(missing parent directories are created)."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"path": _PATH_SCHEMA, "content": {"type": "string"}},
        "required": ["path", "content"],
        "additionalProperties": False,
    }

    def _plan(self, args: Any, ws: Workspace) -> _Plan:
        check_args(args, {"path": str, "content": str}, tool=self.name)
        path = ws.resolve(args["path"], for_write=True)
        target = ws.relative(path)
        try:
            after = args["content"].encode("utf-8")
        except UnicodeEncodeError:
            raise ToolRefusal("invalid_args", "content is not valid Unicode text") from None
        if len(after) > self.max_file_bytes:
            raise ToolRefusal("file_too_large", f"content is over {self.max_file_bytes} bytes", path=target)
        return _Plan(path, target, self._read_before(path, target), after)


@dataclass(frozen=True)
class EditFileTool(_WriteTool):
    name: ClassVar[str] = "edit_file"
    transform: ClassVar[str] = "edit_file/v1"
    description: ClassVar[str] = (
        "Edit a UTF-8 text file in the workspace: replace old_text, which must occur exactly once "
        "in the file, with new_text."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": _PATH_SCHEMA,
            "old_text": {"type": "string", "description": "Exact text to replace; must occur once."},
            "new_text": {"type": "string", "description": "Replacement text."},
        },
        "required": ["path", "old_text", "new_text"],
        "additionalProperties": False,
    }

    def _plan(self, args: Any, ws: Workspace) -> _Plan:
        check_args(args, {"path": str, "old_text": str, "new_text": str}, tool=self.name)
        old, new = args["old_text"], args["new_text"]
        if not old:
            raise ToolRefusal("invalid_args", "old_text must not be empty")
        if old == new:
            # Expected-after would equal before: a crash could never be told apart from no-op.
            raise ToolRefusal("edit_no_change", "old_text and new_text are identical")
        path = ws.resolve(args["path"], for_write=True)
        target = ws.relative(path)
        before = self._read_before(path, target)
        if before is None:
            raise ToolRefusal("file_not_found", "no such file", path=target)
        text = decode_text(before, target)
        first = text.find(old)
        if first < 0:
            raise ToolRefusal("edit_text_not_found", "old_text does not occur in the file", path=target)
        if text.find(old, first + 1) >= 0:
            raise ToolRefusal(
                "edit_text_ambiguous", "old_text occurs more than once; include more context", path=target
            )
        try:
            after = (text[:first] + new + text[first + len(old) :]).encode("utf-8")
        except UnicodeEncodeError:
            raise ToolRefusal("invalid_args", "new_text is not valid Unicode text") from None
        if len(after) > self.max_file_bytes:
            raise ToolRefusal(
                "file_too_large", f"the result is over {self.max_file_bytes} bytes", path=target
            )
        return _Plan(path, target, before, after)
