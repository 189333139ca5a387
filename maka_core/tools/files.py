"""The file tools: ``read_file``, ``list_dir``, ``write_file`` and ``edit_file``.

Reads are ``replay_safe``. Writes are ``reconcile``: before T1 they record the file's before and
expected-after identity (``FileEvidence``), and they replace the file atomically (temporary file
in the same directory, fsync, rename, fsync the directory), so after a crash the file holds either
the before or the expected-after bytes and the reconciler can tell which without writing.
Every path goes through ``Workspace.resolve``; a refusal is an ordinary error result.
"""

from __future__ import annotations

import copy
import functools
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, ParamSpec, Self

from pydantic import Field

from maka_core import failpoints
from maka_core.errors import AttemptSuperseded
from maka_core.facts.codec import canonical_args_hash
from maka_core.facts.events import RecoveryMode
from maka_core.tools import names
from maka_core.tools.base import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_RESULT_BYTE_LIMIT,
    FileEvidence,
    FileIdentity,
    Heartbeat,
    Reconciliation,
    ToolArgs,
    ToolRefusal,
    ToolResult,
    args_schema,
    check_args,
    enforce_result_limit,
)
from maka_core.tools.beneath import (
    escape_name,
    locate,
    open_beneath,
    open_existing,
    read_bytes,
    write_replace,
)
from maka_core.tools.effect_journal import record as record_effect
from maka_core.tools.evidence import reconcile_file
from maka_core.tools.git_guard import named_by_repository
from maka_core.tools.guarded_replace import GuardedReplace, guarded_replace
from maka_core.tools.redo import guarded, redo_write, settled
from maka_core.tools.targets import path_targets

if TYPE_CHECKING:
    from maka_core.workspace import Workspace

P = ParamSpec("P")
_PATH = "Path relative to the workspace root."


class PathArgs(ToolArgs):
    path: str = Field(description=_PATH)


class WriteArgs(ToolArgs):
    path: str = Field(description=_PATH)
    content: str


class EditArgs(ToolArgs):
    path: str = Field(description=_PATH)
    old_text: str = Field(description="Exact text to replace; must occur once.")
    new_text: str = Field(description="Replacement text.")


def read_text_file(ws: Workspace, rel: str, max_bytes: int) -> bytes:
    """The bytes of the regular file at ``rel`` (inside symlinks followed), race-free."""
    _, data = read_existing(ws, rel, max_bytes)
    if data is None:  # only writes see absence as a state
        raise ToolRefusal("file_not_found", "no such file", path=rel)
    return data


def read_existing(
    ws: Workspace, rel: str, max_bytes: int, *, for_write: bool = False
) -> tuple[str, bytes | None]:
    """The canonical relative path of ``rel`` and its bytes (None when absent), race-free.

    For a write (``for_write``) a final symlink is refused rather than followed, and so is a
    hard-linked file: its other names may sit outside the workspace, and its before-bytes would
    describe them too.

    Raises:
        ToolRefusal: the ``beneath`` refusals, ``not_a_file``, ``not_regular_file``,
            ``file_too_large``, ``hardlinked_target``, ``tool_io_failed``.
    """
    root = str(ws.root)
    try:
        if for_write:
            target = locate(root, rel, for_write=True)
            try:
                _refuse_repository_material(ws, target.parts, rel)
                fd, st = open_existing(target)
            except BaseException:
                target.close()
                raise
        else:
            target, fd, st = open_beneath(root, rel)
    except FileNotFoundError:
        if for_write:
            return _canonical(ws, rel), None
        raise ToolRefusal("file_not_found", "no such file", path=rel) from None
    except OSError as exc:
        raise ToolRefusal("tool_io_failed", f"cannot open: {exc.strerror}", path=rel) from None
    try:
        if for_write and st.st_nlink > 1:
            raise ToolRefusal(
                "hardlinked_target", "the file has other hard links; refusing to replace it", path=rel
            )
        return target.rel, read_bytes(fd, st.st_size, max_bytes, rel)
    except OSError as exc:
        raise ToolRefusal("tool_io_failed", f"cannot read: {exc.strerror}", path=rel) from None
    finally:
        os.close(fd)
        target.close()


def _refuse_repository_material(ws: Workspace, parts: tuple[str, ...], rel: str) -> None:
    """``git_repository_refused`` for a write into what a repository above the file names in its
    config (a ``core.hooksPath`` folder, an included config file): the operator's git would run
    it. (A git directory itself is refused by ``beneath.locate``.)"""
    named = named_by_repository(ws.root, parts)
    if named is not None:
        raise ToolRefusal(
            "git_repository_refused",
            f"{named} is named by a repository's config (hooks or an included config): the "
            "operator's git would run what is written there",
            path=rel,
            folder=named,
        )


def _canonical(ws: Workspace, rel: str) -> str:
    with locate(str(ws.root), rel, for_write=True) as target:
        return target.rel


def decode_text(data: bytes, path: str) -> str:
    """UTF-8 text or ``ToolRefusal(file_not_text)``."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolRefusal("file_not_text", "the file is not UTF-8 text", path=path) from None


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

    mutates: ClassVar[bool]
    result_byte_limit: int = DEFAULT_RESULT_BYTE_LIMIT
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES

    def targets(self, args: Mapping[str, Any]) -> frozenset[str] | None:
        """The workspace names this call touches (``tools.targets``): its ``path``, and for a write
        every folder above it."""
        return path_targets(args.get("path"), write=self.mutates)


# --- read tools ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _ReadTool(_FileTool):
    """A read-only tool on one workspace path: no evidence, and re-reading is its recovery."""

    name: ClassVar[str]
    parameters: ClassVar[dict[str, Any]] = args_schema(PathArgs)
    recovery_mode: ClassVar[RecoveryMode] = "replay_safe"
    mutates: ClassVar[bool] = False
    effects: ClassVar[frozenset[str]] = frozenset({"read"})

    def preflight(self, args: dict[str, Any], ws: Workspace) -> ToolResult | None:
        try:
            check_args(PathArgs, args, tool=self.name)
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
    name: ClassVar[str] = names.READ_FILE
    capability: ClassVar[str] = "file.read"
    description: ClassVar[str] = "Read a UTF-8 text file in the workspace and return its content."

    @_refused
    def run(self, args: dict[str, Any], ws: Workspace, heartbeat: Heartbeat) -> ToolResult:
        check_args(PathArgs, args, tool=self.name)
        failpoints.hit("P3", tag=self.name)
        # Read one byte past what could fit so an oversized file is refused, not truncated.
        limit = min(self.max_file_bytes, self.result_byte_limit)
        try:
            data = read_text_file(ws, args["path"], limit)
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
    name: ClassVar[str] = names.LIST_DIR
    capability: ClassVar[str] = "file.list"
    description: ClassVar[str] = (
        "List a directory in the workspace: each entry's name, type (file, dir, symlink, other) "
        "and size for files. Use '.' for the workspace root."
    )

    @_refused
    def run(self, args: dict[str, Any], ws: Workspace, heartbeat: Heartbeat) -> ToolResult:
        check_args(PathArgs, args, tool=self.name)
        failpoints.hit("P3", tag=self.name)
        try:
            target, fd, _ = open_beneath(str(ws.root), args["path"], directory=True)
        except FileNotFoundError:
            raise ToolRefusal("file_not_found", "no such directory", path=args["path"]) from None
        except OSError as exc:
            raise ToolRefusal("tool_io_failed", f"cannot list: {exc.strerror}", path=args["path"]) from None
        try:
            entries = _entries(fd)
        except OSError as exc:
            raise ToolRefusal("tool_io_failed", f"cannot list: {exc.strerror}", path=args["path"]) from None
        finally:
            os.close(fd)
            target.close()
        entries.sort(key=lambda e: e["name"])
        result = ToolResult.json({"path": target.rel, "entries": entries})
        failpoints.hit("P4", tag=self.name)
        return enforce_result_limit(result, self.result_byte_limit)

    def reconcile(
        self, args: dict[str, Any], ws: Workspace, evidence: FileEvidence | None
    ) -> Reconciliation | None:
        return None


def _entries(fd: int) -> list[dict[str, Any]]:
    """The entries of the open directory ``fd``; a non-UTF-8 name is escaped and flagged, since
    the ledger refuses the lossy string ``os`` gives for it."""
    entries: list[dict[str, Any]] = []
    for raw in os.listdir(fd):
        name, escaped = escape_name(raw)
        entry: dict[str, Any] = {"name": name}
        try:
            st = os.stat(raw, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed while listing
        if stat.S_ISLNK(st.st_mode):
            entry["type"] = "symlink"
        elif stat.S_ISDIR(st.st_mode):
            entry["type"] = "dir"
        elif stat.S_ISREG(st.st_mode):
            entry.update(type="file", size=st.st_size)
        else:
            entry["type"] = "other"
        if escaped:
            entry["nameEncoding"] = "escaped"
        entries.append(entry)
    return entries


# --- write tools ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
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
    #: What a permission request says this call is (``maka.permissionRequest`` ``reason``).
    permission_reason: ClassVar[str] = "file_write"
    #: MELRA's derived evidence for this mutation when the policy names none (``{{path}}`` is the
    #: call's ``path``): the file exists afterwards.
    derived_evidence: ClassVar[tuple[dict[str, Any], ...]] = ({"type": "file_exists", "path": "{{path}}"},)

    #: The evidence committed with this call's T1 (``with_evidence``): the write is guarded by it.
    dispatched: FileEvidence | None = None
    #: Asked holding the folder's lock before the write (``with_fence``): False once recovery took
    #: the call over, and the write is not made.
    live: Callable[[], bool] | None = None

    def with_evidence(self, evidence: FileEvidence) -> Self:
        bound = copy.copy(self)
        object.__setattr__(bound, "dispatched", evidence)  # a frozen dataclass, copied for one call
        return bound

    def with_fence(self, live: Callable[[], bool]) -> Self:
        bound = copy.copy(self)
        object.__setattr__(bound, "live", live)
        return bound

    def _plan(self, args: Any, ws: Workspace) -> _Plan:
        raise NotImplementedError

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
            with locate(str(ws.root), plan.target, for_write=True, create_parents=True) as target:
                if target.rel != plan.target or target.dir_fd is None:
                    raise ToolRefusal(
                        "path_changed", "the path changed while it was written", path=plan.target
                    )
                heartbeat()  # an attempt cancelled (or recovered) while it was stalled stops here
                if not self._guarded_write(ws, plan):
                    write_replace(target.dir_fd, target.name, plan.after)
        except OSError as exc:
            raise ToolRefusal("tool_io_failed", f"cannot write: {exc.strerror}", path=plan.target) from None
        record_effect(self.name, ws.root / plan.target, plan.after)  # drills only (MAKA_EFFECT_LOG)
        failpoints.hit("P4", tag=self.name)
        return enforce_result_limit(
            self.result_for(plan.target, FileIdentity.of(plan.after)), self.result_byte_limit
        )

    def _guarded_write(self, ws: Workspace, plan: _Plan) -> bool:
        """The write as a guarded exchange against the T1 evidence's before-state, so an original
        that stalled past its recovery (which may have redone it, and the session written on)
        refuses instead of overwriting; False: no evidence bound, or no ``RENAME_EXCHANGE`` here
        (then the plain atomic rename, as before). No ``/proc`` in-use check: the plain rename has
        the same exposure to a process holding the old file open, and the scan would cost every
        write."""
        ev = self.dispatched
        if ev is None or ev.target != plan.target:
            return False
        done = guarded_replace(
            str(ws.root),
            plan.target,
            ev.before,
            plan.after,
            max_bytes=ev.max_bytes,
            check_in_use=False,
            live=self.live,
        )
        if done.code == "exchange_unsupported":
            return False
        if done.code == "attempt_superseded":
            # A late original: recovery settled the call. No result of ours may commit.
            raise AttemptSuperseded(
                message=f"{self.name}: recovery took this call over; {plan.target} was not written",
                path=plan.target,
            )
        if not done.done:
            raise ToolRefusal(
                done.code or "target_diverged",
                "the file is no longer what this call was dispatched against; not written",
                path=plan.target,
            )
        return True

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

    def redo(
        self,
        args: dict[str, Any],
        ws: Workspace,
        evidence: FileEvidence,
        prior: Reconciliation,
        run: int | None,
    ) -> Reconciliation:
        """Recovery's guarded redo of this write, found in its before-state (``tools.redo``)."""
        return redo_write(
            self.name,
            ws,
            evidence,
            prior,
            run=run,
            content=lambda: self._plan(args, ws).after,
            result_for=lambda ev: enforce_result_limit(
                self.result_for(ev.target, ev.expected_after), self.result_byte_limit
            ),
            replace=self.replace,
            settle=self.settle,
        )

    @staticmethod
    def replace(
        root: str, rel: str, before: FileIdentity | None, data: bytes, max_bytes: int
    ) -> GuardedReplace:
        """The conditional replacement a redo uses."""
        return guarded(root, rel, before, data, max_bytes)

    @staticmethod
    def settle(
        root: str,
        rel: str,
        before: FileIdentity | None,
        after: FileIdentity,
        observe: Callable[[], dict[str, Any]],
        max_bytes: int,
        peer_live: bool,
    ) -> tuple[GuardedReplace | None, dict[str, Any] | None]:
        """How a later recovery settles a redo's leftover and observes, under the folder's lock."""
        return settled(root, rel, before, after, observe, max_bytes, peer_live)


@dataclass(frozen=True)
class WriteFileTool(_WriteTool):
    name: ClassVar[str] = names.WRITE_FILE
    capability: ClassVar[str] = "file.write"
    transform: ClassVar[str] = "write_file/v1"
    description: ClassVar[str] = (
        "Create or replace a UTF-8 text file in the workspace with the given content "
        "(missing parent directories are created)."
    )
    parameters: ClassVar[dict[str, Any]] = args_schema(WriteArgs)

    def _plan(self, args: Any, ws: Workspace) -> _Plan:
        check_args(WriteArgs, args, tool=self.name)
        target, before = read_existing(ws, args["path"], self.max_file_bytes, for_write=True)
        try:
            after = args["content"].encode("utf-8")
        except UnicodeEncodeError:
            raise ToolRefusal("invalid_args", "content is not valid Unicode text") from None
        if len(after) > self.max_file_bytes:
            raise ToolRefusal("file_too_large", f"content is over {self.max_file_bytes} bytes", path=target)
        return _Plan(target, before, after)


@dataclass(frozen=True)
class EditFileTool(_WriteTool):
    name: ClassVar[str] = names.EDIT_FILE
    capability: ClassVar[str] = "file.edit"
    transform: ClassVar[str] = "edit_file/v1"
    description: ClassVar[str] = (
        "Edit a UTF-8 text file in the workspace: replace old_text, which must occur exactly once "
        "in the file, with new_text."
    )
    parameters: ClassVar[dict[str, Any]] = args_schema(EditArgs)

    def _plan(self, args: Any, ws: Workspace) -> _Plan:
        check_args(EditArgs, args, tool=self.name)
        old, new = args["old_text"], args["new_text"]
        if not old:
            raise ToolRefusal("invalid_args", "old_text must not be empty")
        if old == new:
            # Expected-after would equal before: a crash could never be told apart from no-op.
            raise ToolRefusal("edit_no_change", "old_text and new_text are identical")
        target, before = read_existing(ws, args["path"], self.max_file_bytes, for_write=True)
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
        return _Plan(target, before, after)
