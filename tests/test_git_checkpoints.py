"""The Git checkpoint carrier on real repositories (real git, real files, real SIGKILL).

Untracked, ignored, binary and executable files, symlinks, a dirty index, a stash; a workspace
without Git, a bare repository, a merge in progress, submodules. Each property has a negative
control built through the test's own construction: the obvious carrier that captures through the
user's own index, a repository whose configured programs are live, a verifier that only asks
whether the ref exists.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from maka_core import failpoints
from maka_core.checkpoints import (
    BOUNDARY_CODES,
    NO_CHECKPOINT_CODES,
    Checkpoint,
    CheckpointBundle,
    CheckpointPolicy,
    GitCheckpointProvider,
    NoCheckpoint,
    SourceBoundary,
    Verification,
    observe_boundary,
    ref_component,
)
from maka_core.checkpoints.contract import HOST_NO_CHECKPOINT_CODES
from maka_core.checkpoints.git_scan import FileEntry as _Entry
from maka_core.errors import CheckpointError
from maka_core.workspace import MARKER_NAME, Workspace

ROOT = Path(__file__).resolve().parents[1]
GIT_ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
    "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
}  # fmt: skip


def git(cwd: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"git {args}: {proc.stderr}")
    return proc.stdout


def make_repo(root: Path) -> Workspace:
    """A repository in every state a user's can be in: committed, staged over, dirty, stashed,
    untracked, ignored, binary, executable, symlinked."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("print('v1')\n")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "run.sh").chmod(0o755)
    (root / "logo.bin").write_bytes(bytes(range(256)) * 4)
    (root / "link").symlink_to("src/app.py")
    (root / ".gitignore").write_text("*.log\nbuild/\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "one")
    (root / "src" / "app.py").write_text("print('stashed')\n")
    git(root, "stash", "-q")
    (root / "src" / "app.py").write_text("print('staged')\n")
    git(root, "add", "src/app.py")
    (root / "src" / "app.py").write_text("print('on disk')\n")  # the index differs from disk
    (root / "notes.txt").write_text("untracked\n")
    (root / "debug.log").write_text("ignored\n")
    (root / "build").mkdir()
    (root / "build" / "out.o").write_bytes(b"\x7fELF")
    ws = Workspace.open(root)  # writes the marker and its info/exclude line, like any session
    time.sleep(0.1)  # older than the racy window, so the stat cache trusts these files
    return ws


def user_state(root: Path) -> dict[str, object]:
    """Everything of the user's repository a capture must leave as it was: every byte under
    .git (index, HEAD, refs, packed-refs, logs, stash, objects, config), the index's mtime, the
    work tree's files, and what git itself reports."""
    state: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            state[rel] = ("link", os.readlink(path))
        elif path.is_file():
            state[rel] = ("file", hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mode)
        elif path.is_dir():
            state[rel] = ("dir", path.stat().st_mode)
    state["index mtime"] = (root / ".git" / "index").stat().st_mtime_ns
    state["status"] = git(
        root, "--no-optional-locks", "status", "--porcelain=v2", "--branch", "--untracked-files=all"
    )
    state["stash"] = git(root, "stash", "list")
    state["reflog"] = git(root, "reflog", "--all")
    state["refs"] = git(root, "for-each-ref")
    return state


def tree_files(root: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if ".git" in path.relative_to(root).parts:
            continue
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path))
        elif path.is_file():
            out[rel] = ("file", path.read_bytes(), bool(path.stat().st_mode & 0o100))
    return out


@pytest.fixture
def repo(tmp_path: Path) -> Workspace:
    return make_repo(tmp_path / "ws")


@pytest.fixture
def provider(tmp_path: Path) -> GitCheckpointProvider:
    return GitCheckpointProvider(tmp_path / "state")


class UserIndexCarrier(GitCheckpointProvider):
    """The obvious carrier (negative control): stage everything in the user's own index and
    write that tree, as ``git stash create`` or ``git add -A && git write-tree`` would."""

    def capture(self, workspace: Workspace, session_id: str) -> Checkpoint | NoCheckpoint:
        git(workspace.root, "add", "-A")
        tree = git(workspace.root, "write-tree").strip()
        return Checkpoint(ref="refs/maka/checkpoints/x/1", commit=tree, tree=tree, file_count=0, byte_count=0)


# --- capture leaves the user's repository alone ---------------------------------------------


def test_capture_verify_diff_restore_and_gc_leave_the_users_repository_byte_for_byte(
    repo: Workspace, provider: GitCheckpointProvider, tmp_path: Path
) -> None:
    before = user_state(repo.root)
    first = provider.capture(repo, "s-1")
    assert isinstance(first, Checkpoint), first
    (repo.root / "notes.txt").write_text("changed while parked\n")
    before_second = user_state(repo.root)
    second = provider.capture(repo, "s-1")
    assert isinstance(second, Checkpoint)
    assert provider.verify(repo, first).verified and provider.verify(repo, second).verified
    assert not provider.diff(repo, first).unchanged
    provider.materialize(repo, first, tmp_path / "restored")
    provider.gc(repo, keep={second.ref}, grace_seconds=0, prune="now")
    assert user_state(repo.root) == before_second
    # Between the two captures only the (untracked) file the test edited changed.
    assert [k for k in before if before[k] != before_second[k]] == ["notes.txt"]
    assert not (repo.root / ".git" / "refs" / "maka").exists()


def test_negative_control_capturing_through_the_users_index_changes_it(
    repo: Workspace, tmp_path: Path
) -> None:
    before = user_state(repo.root)
    UserIndexCarrier(tmp_path / "state").capture(repo, "s-1")
    after = user_state(repo.root)
    assert after != before
    assert after["status"] != before["status"]  # the user's dirty index was staged over
    assert after[".git/index"] != before[".git/index"]


def test_a_checkpoint_holds_the_bytes_on_disk_and_restores_them_elsewhere(
    repo: Workspace, provider: GitCheckpointProvider, tmp_path: Path
) -> None:
    checkpoint = provider.capture(repo, "s-1")
    assert isinstance(checkpoint, Checkpoint)
    dest = provider.materialize(repo, checkpoint, tmp_path / "restored")
    restored = tree_files(dest)
    expected = {
        k: v
        for k, v in tree_files(repo.root).items()
        if k not in ("debug.log", "build/out.o", MARKER_NAME)  # ignored files and the marker stay out
    }
    assert restored == expected
    assert restored["src/app.py"] == ("file", b"print('on disk')\n", False)  # disk, not the index
    assert restored["run.sh"][2] is True and restored["link"] == ("link", "src/app.py")
    assert restored["notes.txt"] == ("file", b"untracked\n", False)
    assert Workspace.open(dest).identity != repo.identity  # a restore is another workspace
    assert checkpoint.file_count == len(expected)
    assert checkpoint.byte_count == sum(len(v[1]) for v in expected.values() if v[0] == "file") + len(
        "src/app.py"
    )
    # A restore never lands where it was: a folder that exists, or anywhere inside the workspace.
    for dest_bad, code in (
        (dest, "restore_destination_exists"),
        (repo.root / "r", "restore_destination_inside_workspace"),
    ):
        with pytest.raises(CheckpointError) as refused:
            provider.materialize(repo, checkpoint, dest_bad)
        assert refused.value.code == code
    assert not (repo.root / "r").exists()


def test_a_store_inside_the_workspace_is_refused(repo: Workspace) -> None:
    with pytest.raises(CheckpointError) as refused:
        GitCheckpointProvider(repo.root / ".maka-state").capture(repo, "s-1")
    assert refused.value.code == "checkpoint_store_inside_workspace"
    assert not (repo.root / ".maka-state").exists()


def test_non_utf8_and_quoted_names_round_trip(provider: GitCheckpointProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    git(root, "init", "-q")
    names = [b"caf\xc3\xa9.txt", b"raw\xff.txt", b"with space", b'"quoted"', b"tab\there", b"back\\slash"]
    for name in names:
        (Path(os.fsdecode(root)) / os.fsdecode(name)).write_bytes(name)
    ws = Workspace.open(root)
    checkpoint = provider.capture(ws, "s-1")
    assert isinstance(checkpoint, Checkpoint) and checkpoint.file_count == len(names)
    dest = provider.materialize(ws, checkpoint, tmp_path / "restored")
    assert sorted(os.listdir(os.fsencode(dest))) == sorted(names)
    assert provider.diff(ws, checkpoint).unchanged
    os.unlink(os.path.join(os.fsencode(root), b"raw\xff.txt"))
    assert [(c.path, c.kind) for c in provider.diff(ws, checkpoint).changes] == [("raw\\xff.txt", "deleted")]


class SwapBeforeRead(GitCheckpointProvider):
    """Swaps ``src`` for a symlink to a folder outside, after the listing and before the reads."""

    outside: Path

    def _read(self, workspace: Workspace, entry: _Entry) -> bytes | None:
        src = workspace.root / "src"
        if not src.is_symlink():
            src.rename(workspace.root / "src.moved")
            src.symlink_to(self.outside)
        return super()._read(workspace, entry)


class PathReader(SwapBeforeRead):
    """Negative control: reads each file by its full path, as a plain ``open`` would."""

    def _read(self, workspace: Workspace, entry: _Entry) -> bytes | None:
        super()._read(workspace, entry)  # the swap, and the stat key
        data = (workspace.root / os.fsdecode(entry.path)).read_bytes()
        entry.blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        return data


@pytest.mark.parametrize("carrier", [SwapBeforeRead, PathReader])
def test_a_folder_swapped_for_a_symlink_mid_capture_never_pulls_in_outside_files(
    carrier: type[SwapBeforeRead], repo: Workspace, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "app.py").write_text("OUTSIDE SECRET\n")
    provider = carrier(tmp_path / "state")
    provider.outside = outside
    checkpoint = provider.capture(repo, "s-1")
    assert isinstance(checkpoint, Checkpoint)
    restored = tree_files(provider.materialize(repo, checkpoint, tmp_path / "restored"))
    leaked = restored.get("src/app.py") == ("file", b"OUTSIDE SECRET\n", False)
    assert leaked is (carrier is PathReader)  # the control does read the outside file
    if carrier is SwapBeforeRead:
        assert "src/app.py" not in restored  # the path changed while captured: not in it


# --- nothing the repository configures runs ----------------------------------------------------


def arm(root: Path, sentinel: Path) -> None:
    """Configure every program a repository can make git run on the commands a carrier might use."""
    hooks = root / "hooks-dir"
    hooks.mkdir()
    for hook in ("reference-transaction", "post-index-change", "pre-commit", "post-commit"):
        (hooks / hook).write_text(f"#!/bin/sh\necho {hook} >> {sentinel}\n")
        (hooks / hook).chmod(0o755)
    touch = f"sh -c 'echo $0 >> {sentinel}; cat'"
    git(root, "config", "filter.evil.clean", touch.replace("$0", "clean"))
    git(root, "config", "filter.evil.smudge", touch.replace("$0", "smudge"))
    git(root, "config", "core.fsmonitor", f"sh -c 'echo fsmonitor >> {sentinel}'")
    git(root, "config", "core.hooksPath", str(hooks))
    git(root, "config", "diff.external", f"sh -c 'echo diff >> {sentinel}'")
    git(root, "config", "core.autocrlf", "true")
    (root / ".gitattributes").write_text("*.txt filter=evil\n")


def test_no_filter_hook_or_fsmonitor_runs_and_crlf_bytes_survive(
    provider: GitCheckpointProvider, tmp_path: Path
) -> None:
    root, sentinel = tmp_path / "ws", tmp_path / "ran"
    root.mkdir()
    git(root, "init", "-q")
    arm(root, sentinel)
    (root / "dos.txt").write_bytes(b"line one\r\nline two\r\n")
    ws = Workspace.open(root)
    checkpoint = provider.capture(ws, "s-1")
    assert isinstance(checkpoint, Checkpoint)
    assert provider.verify(ws, checkpoint).verified and provider.diff(ws, checkpoint).unchanged
    dest = provider.materialize(ws, checkpoint, tmp_path / "restored")
    provider.gc(ws, keep=(), grace_seconds=0, prune="now")
    assert not sentinel.exists(), sentinel.read_text()
    assert (dest / "dos.txt").read_bytes() == b"line one\r\nline two\r\n"
    # Negative control: the same repository's own git does run them (the configuration is live).
    git(root, "add", "-A")
    assert {"clean", "fsmonitor", "post-index-change"} <= set(sentinel.read_text().split())


# --- incremental capture -------------------------------------------------------------------------


class CountingReads(GitCheckpointProvider):
    """Counts the files a capture reads and hashes, and the trees it writes."""

    reads: list[bytes]
    trees_written = 0

    def _read(self, workspace: Workspace, entry: _Entry) -> bytes | None:
        self.reads.append(entry.path)
        return super()._read(workspace, entry)

    def _run(self, args: list[str], **kw: Any) -> subprocess.CompletedProcess[bytes]:
        done = super()._run(args, **kw)
        if args[0] == "mktree":
            self.trees_written += len(done.stdout.split())
        return done


def test_an_incremental_capture_reads_only_what_changed(repo: Workspace, tmp_path: Path) -> None:
    provider = CountingReads(tmp_path / "state")
    provider.reads = []
    first = provider.capture(repo, "s-1")
    assert isinstance(first, Checkpoint) and len(provider.reads) == first.file_count
    assert provider.trees_written == 2  # the root and src/
    (repo.root / "notes.txt").write_text("edited\n")
    provider.reads, provider.trees_written = [], 0
    second = provider.capture(repo, "s-1")
    assert isinstance(second, Checkpoint) and provider.reads == [b"notes.txt"]
    assert provider.trees_written == 1  # only the root: src/ is the same tree
    assert (
        second.tree
        == git(
            repo.root, "--git-dir", str(provider.store(repo)), "rev-parse", f"{second.commit}^{{tree}}"
        ).strip()
    )
    assert second.tree != first.tree and second.ref.endswith("/2")
    # notes.txt was written within the racy window of that scan, so it is not trusted yet: read
    # once more, then cached.
    time.sleep(0.1)
    provider.reads = []
    assert isinstance(provider.capture(repo, "s-1"), Checkpoint) and provider.reads == [b"notes.txt"]
    provider.reads = []
    assert isinstance(provider.capture(repo, "s-1"), Checkpoint) and provider.reads == []
    # Same size, mtime set back: the ctime still tells, so the cache does not hide the change.
    notes = repo.root / "notes.txt"
    st = notes.stat()
    notes.write_text("EDITED\n")
    os.utime(notes, ns=(st.st_atime_ns, st.st_mtime_ns))
    time.sleep(0.1)
    provider.reads = []
    third = provider.capture(repo, "s-1")
    assert isinstance(third, Checkpoint) and provider.reads == [b"notes.txt"] and third.tree != second.tree
    # Another session of the same workspace shares the cache: nothing to read.
    provider.reads = []
    time.sleep(0.1)
    assert isinstance(provider.capture(repo, "s-1"), Checkpoint)  # caches the set-back file
    provider.reads = []
    other = provider.capture(repo, "s-2")
    assert isinstance(other, Checkpoint) and provider.reads == [] and other.tree == third.tree
    assert other.ref == f"refs/maka/checkpoints/{ref_component('s-2')}/1"


def test_a_cache_naming_a_collected_blob_falls_back_to_the_bytes(
    repo: Workspace, provider: GitCheckpointProvider
) -> None:
    first = provider.capture(repo, "s-1")
    assert isinstance(first, Checkpoint)
    cache = provider.store(repo).parent / f"{repo.workspace_id}.stat-cache.json"
    saved = cache.read_bytes()
    provider.gc(repo, keep=(), grace_seconds=0, prune="now")  # every blob is gone
    cache.write_bytes(saved)  # a cache from before the collection
    again = provider.capture(repo, "s-1")
    assert (
        isinstance(again, Checkpoint) and again.tree == first.tree and provider.verify(repo, again).verified
    )


# --- diff ----------------------------------------------------------------------------------------


def test_diff_names_each_changed_path_and_its_kind_never_its_content(
    repo: Workspace, provider: GitCheckpointProvider
) -> None:
    checkpoint = provider.capture(repo, "s-1")
    assert isinstance(checkpoint, Checkpoint)
    assert provider.diff(repo, checkpoint).unchanged and provider.diff(repo, checkpoint).refusal() is None
    (repo.root / "notes.txt").write_text("SECRET CONTENT\n")
    (repo.root / "new.txt").write_text("SECRET CONTENT\n")
    (repo.root / "logo.bin").unlink()
    (repo.root / "link").unlink()
    (repo.root / "link").write_text("now a file\n")
    (repo.root / "run.sh").chmod(0o644)
    (repo.root / "debug.log").write_text("ignored changes are not changes\n")
    diff = provider.diff(repo, checkpoint)
    assert [(c.path, c.kind) for c in diff.changes] == [
        ("link", "type_changed"), ("logo.bin", "deleted"), ("new.txt", "added"),
        ("notes.txt", "modified"), ("run.sh", "modified"),
    ]  # fmt: skip
    refusal = diff.refusal()
    assert refusal is not None and refusal.code == "workspace_content_changed"
    assert refusal.detail["changedPaths"] == {
        "type_changed": ["link"], "deleted": ["logo.bin"], "added": ["new.txt"],
        "modified": ["notes.txt", "run.sh"],
    }  # fmt: skip
    assert "SECRET" not in str(refusal.to_json())


# --- eligibility ---------------------------------------------------------------------------------


def _merge_conflict(root: Path) -> None:
    (root / "f.txt").write_text("base\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    git(root, "checkout", "-qb", "other")
    (root / "f.txt").write_text("other\n")
    git(root, "commit", "-qam", "other")
    git(root, "checkout", "-q", "main")
    (root / "f.txt").write_text("main\n")
    git(root, "commit", "-qam", "main")
    git(root, "merge", "other", check=False)


def _ineligible(kind: str, tmp_path: Path) -> tuple[Workspace, GitCheckpointProvider]:
    root = tmp_path / "ws"
    root.mkdir()
    provider = GitCheckpointProvider(tmp_path / "state")
    if kind == "git_unavailable":
        git(root, "init", "-q")
        provider = GitCheckpointProvider(tmp_path / "state", git=str(tmp_path / "no-git"))
    elif kind == "workspace_not_git":
        (root / "a.txt").write_text("a")
    elif kind == "repository_bare":
        git(root, "init", "-q", "--bare")
    elif kind == "repository_operation_in_progress":
        git(root, "init", "-q", "-b", "main")
        _merge_conflict(root)
    elif kind == "repository_has_submodules":
        git(root, "init", "-q")
        git(root / "..", "init", "-q", str(root / "vendor"))
        (root / "vendor" / "x").write_text("x")
    elif kind == "workspace_too_large":
        git(root, "init", "-q")
        for i in range(3):
            (root / f"{i}.txt").write_text("x")
        provider = GitCheckpointProvider(tmp_path / "state", policy=CheckpointPolicy(max_files=2))
    return Workspace.open(root), provider


@pytest.mark.parametrize(
    "code", sorted(NO_CHECKPOINT_CODES - HOST_NO_CHECKPOINT_CODES - {"repository_unreadable"})
)
def test_an_ineligible_workspace_gets_a_typed_no_checkpoint_and_no_store(code: str, tmp_path: Path) -> None:
    ws, provider = _ineligible(code, tmp_path)
    files = tree_files(ws.root)
    outcome = provider.capture(ws, "s-1")
    assert isinstance(outcome, NoCheckpoint) and outcome.code == code, outcome
    assert provider.eligibility(ws) == outcome
    assert not provider.store(ws).exists()
    assert tree_files(ws.root) == files


def test_a_tracked_submodule_is_ineligible(tmp_path: Path, provider: GitCheckpointProvider) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    git(root, "init", "-q")
    git(root, "update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},vendor")
    outcome = provider.capture(Workspace.open(root), "s-1")
    assert isinstance(outcome, NoCheckpoint) and outcome.code == "repository_has_submodules"


def test_a_workspace_in_a_subfolder_captures_only_that_subfolder(
    tmp_path: Path, provider: GitCheckpointProvider
) -> None:
    top = tmp_path / "repo"
    (top / "app").mkdir(parents=True)
    git(top, "init", "-q")
    (top / "outside.txt").write_text("not the workspace")
    (top / "app" / "main.py").write_text("x")
    ws = Workspace.open(top / "app")
    checkpoint = provider.capture(ws, "s-1")
    assert isinstance(checkpoint, Checkpoint)
    assert tree_files(provider.materialize(ws, checkpoint, tmp_path / "r")) == {
        "main.py": ("file", b"x", False)
    }


# --- verify --------------------------------------------------------------------------------------


class RefExistsVerifier(GitCheckpointProvider):
    """Negative control: a verifier that only asks whether the ref still names the commit."""

    def verify(self, workspace: Workspace, checkpoint: Checkpoint) -> Verification:
        ok = self._git_store(workspace, ["rev-parse", "-q", "--verify", checkpoint.ref], check=False)
        code = None if ok.returncode == 0 else "checkpoint_missing"
        return Verification.model_validate(
            {"checkpointRef": checkpoint.ref, **({"code": code} if code else {})}
        )


def _loosen(provider: GitCheckpointProvider, ws: Workspace) -> Path:
    """Turn the store's packs into loose objects, so one object's bytes can be replaced."""
    store = provider.store(ws)
    packs = sorted((store / "objects" / "pack").glob("*.pack"))
    for pack in packs:
        moved = pack.with_suffix(".moved")
        pack.rename(moved)
        pack.with_suffix(".idx").unlink()
        subprocess.run(
            ["git", "--git-dir", str(store), "unpack-objects", "-q"], stdin=moved.open("rb"), check=True
        )
        moved.unlink()
    return store


def test_verify_fails_closed_on_a_missing_moved_mismatched_or_corrupt_checkpoint(
    repo: Workspace, provider: GitCheckpointProvider, tmp_path: Path
) -> None:
    first, second = provider.capture(repo, "s-1"), None
    (repo.root / "notes.txt").write_text("two\n")
    second = provider.capture(repo, "s-1")
    assert isinstance(first, Checkpoint) and isinstance(second, Checkpoint)
    assert provider.verify(repo, first) == Verification(checkpoint_ref=first.ref)
    assert (
        provider.verify(repo, first.model_copy(update={"tree": second.tree})).code
        == "checkpoint_tree_mismatch"
    )
    assert (
        provider.verify(repo, first.model_copy(update={"commit": second.commit})).code
        == "checkpoint_ref_moved"
    )
    store = _loosen(provider, repo)
    blob = git(repo.root, "hash-object", "notes.txt").strip()  # "two\n", only in the second checkpoint
    loose = store / "objects" / blob[:2] / blob[2:]
    loose.chmod(0o644)
    loose.write_bytes(zlib.compress(b"blob 4\0TWO\n"))
    assert provider.verify(repo, second).code == "checkpoint_objects_corrupt"
    assert RefExistsVerifier(tmp_path / "state").verify(repo, second).verified  # the control is fooled
    loose.unlink()
    assert provider.verify(repo, second).code == "checkpoint_objects_missing"
    git(repo.root, "--git-dir", str(store), "update-ref", "-d", first.ref)
    assert provider.verify(repo, first).code == "checkpoint_missing"
    with pytest.raises(CheckpointError) as refused:
        provider.materialize(repo, second, tmp_path / "r")
    assert refused.value.code in ("checkpoint_objects_missing", "checkpoint_git_failed")
    assert not (tmp_path / "r").exists() and not list(tmp_path.glob(".r.maka-restore-*"))


# --- retention -----------------------------------------------------------------------------------


def test_gc_deletes_only_refs_no_lineage_keeps_and_spares_young_ones(
    repo: Workspace, provider: GitCheckpointProvider
) -> None:
    a1 = provider.capture(repo, "session-a")
    (repo.root / "notes.txt").write_text("a2\n")
    a2 = provider.capture(repo, "session-a")
    (repo.root / "notes.txt").write_text("b1\n")
    b1 = provider.capture(repo, "session-b")
    assert isinstance(a1, Checkpoint) and isinstance(a2, Checkpoint) and isinstance(b1, Checkpoint)
    assert provider.gc(repo, keep={a2.ref}) == ()  # all young: a capture may be committing its fact
    assert provider.gc(repo, keep={a2.ref, b1.ref}, grace_seconds=0, prune="now") == (a1.ref,)
    assert set(provider.refs(repo)) == {a2.ref, b1.ref}
    assert provider.verify(repo, a2).verified and provider.verify(repo, b1).verified
    assert provider.verify(repo, a1).code == "checkpoint_missing"
    # The collected checkpoint's only blob ("untracked\n") is gone from the store.
    blob = hashlib.sha1(b"blob 10\0untracked\n").hexdigest()
    assert (
        subprocess.run(
            ["git", "--git-dir", str(provider.store(repo)), "cat-file", "-e", blob], check=False
        ).returncode
        != 0
    )


# --- crash drills --------------------------------------------------------------------------------

CHILD = """
import sys
from pathlib import Path
from maka_core.checkpoints import GitCheckpointProvider, Checkpoint
from maka_core.workspace import Workspace
ws = Workspace.open(sys.argv[1], create=False)
provider = GitCheckpointProvider(sys.argv[2])
if sys.argv[3] == "capture":
    provider.capture(ws, "s-1")
else:
    provider.materialize(ws, Checkpoint.model_validate_json(sys.argv[4]), Path(sys.argv[5]))
print("survived")
"""


def run_child(point: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MAKA_FAILPOINT": point}
    return subprocess.run(
        [sys.executable, "-c", CHILD, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def count_objects(provider: GitCheckpointProvider, ws: Workspace) -> int:
    out = git(ws.root, "--git-dir", str(provider.store(ws)), "count-objects", "-v")
    fields = dict(line.split(": ") for line in out.splitlines())
    return int(fields["count"]) + int(fields["in-pack"])


CAPTURE_POINTS = ("checkpoint_capture_after_objects", "checkpoint_capture_after_ref")


def test_every_checkpoint_failpoint_is_drilled() -> None:
    from tests.test_guarded_replace import POINTS
    from tests.test_late_attempt import FENCE_POINTS
    from tests.test_repair_checkpoint import REPAIR_POINTS
    from tests.test_workspace_continuity import WIRED_POINTS

    drilled = {
        *CAPTURE_POINTS,
        "checkpoint_during_materialize",
        *POINTS,
        *FENCE_POINTS,
        *WIRED_POINTS,
        *REPAIR_POINTS,
    }
    assert drilled == set(failpoints.CHECKPOINT)


@pytest.mark.parametrize("point", CAPTURE_POINTS)
def test_a_capture_killed_at_its_commit_points_leaves_nothing_half_visible(
    point: str, repo: Workspace, provider: GitCheckpointProvider
) -> None:
    assert point in failpoints.CHECKPOINT
    killed = run_child(point, str(repo.root), str(provider.state_dir), "capture")
    assert killed.returncode == -9, killed.stderr
    refs = provider.refs(repo)
    if point == "checkpoint_capture_after_objects":
        assert refs == {}  # objects only: no checkpoint exists
    else:
        assert list(refs) == ["refs/maka/checkpoints/s-1/1"]  # the artifact, its fact never committed
        assert provider.gc(repo, keep=()) == ()  # young: it could be a capture committing its fact
    assert count_objects(provider, repo) > 0
    provider.gc(repo, keep=(), grace_seconds=0, prune="now")  # the orphan is collected
    assert provider.refs(repo) == {} and count_objects(provider, repo) == 0
    fresh = provider.capture(repo, "s-1")  # and the next capture is whole
    assert isinstance(fresh, Checkpoint) and provider.verify(repo, fresh).verified


def test_a_restore_killed_while_staging_leaves_no_destination_and_the_next_one_completes(
    repo: Workspace, provider: GitCheckpointProvider, tmp_path: Path
) -> None:
    checkpoint = provider.capture(repo, "s-1")
    assert isinstance(checkpoint, Checkpoint)
    dest = tmp_path / "restored"
    files = tree_files(repo.root)
    killed = run_child(
        "checkpoint_during_materialize", str(repo.root), str(provider.state_dir), "materialize",
        checkpoint.model_dump_json(), str(dest),
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    assert not dest.exists()
    assert len(list(tmp_path.glob(".restored.maka-restore-*"))) == 1  # the staging folder, never dest
    assert tree_files(repo.root) == files
    provider.materialize(repo, checkpoint, dest)
    assert not list(tmp_path.glob(".restored.maka-restore-*"))
    assert tree_files(dest)["src/app.py"] == ("file", b"print('on disk')\n", False)


def test_racing_captures_of_one_session_take_distinct_numbers(
    repo: Workspace, provider: GitCheckpointProvider
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        made = list(pool.map(lambda _: provider.capture(repo, "s-1"), range(8)))
    assert all(isinstance(m, Checkpoint) for m in made)
    refs = sorted(m.ref for m in made if isinstance(m, Checkpoint))
    assert refs == sorted(f"refs/maka/checkpoints/s-1/{n}" for n in range(1, 9))
    assert all(provider.verify(repo, m).verified for m in made if isinstance(m, Checkpoint))


def test_a_workspace_that_became_ineligible_cannot_be_compared(
    repo: Workspace, provider: GitCheckpointProvider
) -> None:
    checkpoint = provider.capture(repo, "s-1")
    assert isinstance(checkpoint, Checkpoint)
    (repo.root / ".git" / "MERGE_HEAD").write_text(git(repo.root, "rev-parse", "HEAD"))
    with pytest.raises(CheckpointError) as refused:
        provider.diff(repo, checkpoint)
    assert refused.value.code == "checkpoint_workspace_ineligible"
    assert refused.value.detail["reason"] == "repository_operation_in_progress"


# --- what a continuation would observe -------------------------------------------------------------

SOURCE_DIGEST = "sha256:" + "5e" * 32


def bundle_for(repo: Workspace, outcome: Checkpoint | NoCheckpoint, high_water: int = 7) -> CheckpointBundle:
    runtime = {
        "workspace_identity": repo.identity,
        "workspace_epoch": 0,
        "immutable_runtime_high_water": high_water,
        "immutable_runtime_digest": SOURCE_DIGEST,
    }
    return CheckpointBundle.of(runtime, outcome, CheckpointPolicy())


def test_observing_a_boundary_names_what_a_continuation_would_find(
    repo: Workspace, provider: GitCheckpointProvider, tmp_path: Path
) -> None:
    source = SourceBoundary(
        workspace_identity=repo.identity,
        immutable_runtime_high_water=7,
        immutable_runtime_digest=SOURCE_DIGEST,
    )
    checkpoint = provider.capture(repo, "s-1")
    assert isinstance(checkpoint, Checkpoint)
    bundle = CheckpointBundle.decode(bundle_for(repo, checkpoint).encode())  # as stored and read back

    def code(b: CheckpointBundle = bundle, ws: Workspace = repo) -> str:
        return observe_boundary(provider, ws, source, b).code

    assert code() == "workspace_matches_checkpoint"
    assert code(bundle_for(repo, checkpoint, high_water=8)) == "checkpoint_boundary_mismatch"
    other = make_repo(tmp_path / "other")
    assert code(ws=other) == "checkpoint_workspace_mismatch"
    absent = observe_boundary(provider, repo, source, bundle_for(repo, NoCheckpoint(code="repository_bare")))
    assert absent.code == "workspace_has_no_checkpoint" and absent.no_checkpoint is not None
    (repo.root / "notes.txt").write_text("changed while parked\n")
    changed = observe_boundary(provider, repo, source, bundle)
    assert changed.code == "workspace_content_changed" and [c.path for c in changed.changes] == ["notes.txt"]
    (repo.root / ".git" / "MERGE_HEAD").write_text(git(repo.root, "rev-parse", "HEAD"))
    assert code() == "checkpoint_workspace_ineligible"
    git(repo.root, "--git-dir", str(provider.store(repo)), "update-ref", "-d", checkpoint.ref)
    assert code() == "checkpoint_missing"  # verified before anything is compared
    assert {
        "workspace_matches_checkpoint",
        "checkpoint_missing",
        "workspace_content_changed",
    } <= BOUNDARY_CODES


def test_many_new_files_go_through_one_pack_and_round_trip(
    provider: GitCheckpointProvider, tmp_path: Path
) -> None:
    from maka_core.checkpoints.git_capture import FEW_BLOBS

    root = tmp_path / "ws"
    (root / "d").mkdir(parents=True)
    git(root, "init", "-q")
    for i in range(FEW_BLOBS * 2):
        (root / "d" / f"{i}.txt").write_bytes(b"%d\n" % i * (i + 1))
    ws = Workspace.open(root)
    checkpoint = provider.capture(ws, "s-1")
    assert isinstance(checkpoint, Checkpoint) and checkpoint.file_count == FEW_BLOBS * 2
    assert list((provider.store(ws) / "objects" / "pack").glob("*.pack"))  # fast-import's pack
    assert provider.verify(ws, checkpoint).verified and provider.diff(ws, checkpoint).unchanged
    restored = provider.materialize(ws, checkpoint, tmp_path / "restored")
    assert tree_files(restored) == {k: v for k, v in tree_files(root).items() if k != MARKER_NAME}


@pytest.mark.parametrize("names", [[], ["a/x", "a.txt", "a-b", "a0", "a/b/c", "ab/d", "a.b/e"]])
def test_tree_ids_agree_with_git_for_git_sort_order_and_an_empty_workspace(
    names: list[str], provider: GitCheckpointProvider, tmp_path: Path
) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    git(root, "init", "-q")
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    ws = Workspace.open(root)
    checkpoint = provider.capture(ws, "s-1")  # mktree's ids must equal the computed ones
    assert isinstance(checkpoint, Checkpoint) and checkpoint.file_count == len(names)
    # The same files through git's own index give the same tree.
    git(root, "add", "-A")
    assert checkpoint.tree == git(root, "write-tree").strip()


def test_the_held_cache_lags_its_file_by_a_few_entries_at_most(repo: Workspace, tmp_path: Path) -> None:
    from maka_core.checkpoints.git_scan import CACHE_SLACK

    worker = CountingReads(tmp_path / "state")
    worker.reads = []
    assert isinstance(worker.capture(repo, "s-1"), Checkpoint)
    cache = worker.store(repo).parent / f"{repo.workspace_id}.stat-cache.json"
    written = cache.stat().st_mtime_ns
    (repo.root / "notes.txt").write_text("edited\n")
    time.sleep(0.1)
    worker.capture(repo, "s-1")
    time.sleep(0.1)
    worker.reads = []
    worker.capture(repo, "s-1")
    assert worker.reads == [] and cache.stat().st_mtime_ns == written  # held, not rewritten
    other = CountingReads(tmp_path / "state")  # another process: reads the file
    other.reads = []
    assert isinstance(other.capture(repo, "s-1"), Checkpoint) and other.reads == [b"notes.txt"]
    # More moved entries than the slack: the file is rewritten.
    for i in range(CACHE_SLACK + 1):
        (repo.root / f"new{i}.txt").write_text(str(i))
    time.sleep(0.1)
    worker.capture(repo, "s-1")
    time.sleep(0.1)
    worker.capture(repo, "s-1")
    assert cache.stat().st_mtime_ns != written
    third = CountingReads(tmp_path / "state")
    third.reads = []
    assert isinstance(third.capture(repo, "s-1"), Checkpoint) and third.reads == []


def test_a_tracked_folder_replaced_by_a_symlink_captures_the_symlink_not_the_index_paths(
    repo: Workspace, provider: GitCheckpointProvider, tmp_path: Path
) -> None:
    # mv src src.real && ln -s src.real src, with src/app.py still in the index. A capture before
    # fills the stat cache: src/app.py, stat'ed through the link, is the same inode, so its blob
    # is vouched for and never re-read (a read, which follows no symlink, would drop it).
    root = repo.root
    assert isinstance(provider.capture(repo, "s-0"), Checkpoint)
    (root / "src").rename(root / "src.real")
    (root / "src").symlink_to("src.real")
    listed = git(root, "ls-files", "--cached", "--others", "--exclude-standard")
    assert "src/app.py" in listed.split() and "src" in listed.split(), listed  # git lists both
    checkpoint = provider.capture(repo, "s-1")
    assert isinstance(checkpoint, Checkpoint), checkpoint
    assert provider.verify(repo, checkpoint).verified
    restored = tree_files(provider.materialize(repo, checkpoint, tmp_path / "restored"))
    assert restored["src"] == ("link", "src.real")
    assert restored["src.real/app.py"] == ("file", b"print('on disk')\n", False)
    assert "src/app.py" not in restored
    assert provider.diff(repo, checkpoint).unchanged


class SwapAfterListing(GitCheckpointProvider):
    """Swaps ``src`` for a symlink to a folder outside after git listed the files, before they are
    stat'ed (loading the stat cache falls between the two)."""

    outside: Path

    def _load_cache(self, workspace: Workspace) -> Any:
        src = workspace.root / "src"
        if not src.is_symlink():
            src.rename(workspace.root / "src.moved")
            src.symlink_to(self.outside)
        return super()._load_cache(workspace)


class SwapBeforeLinkRead(SwapBeforeRead):
    """The same swap after the stat, before the link's target is read."""


@pytest.mark.parametrize("carrier", [SwapAfterListing, SwapBeforeLinkRead])
def test_a_folder_swapped_for_a_symlink_never_captures_an_outside_links_target(
    carrier: type[SwapAfterListing], repo: Workspace, tmp_path: Path
) -> None:
    (repo.root / "src" / "ln").symlink_to("inside-target")
    git(repo.root, "add", "src/ln")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "ln").symlink_to("OUTSIDE LINK TARGET")
    provider = carrier(tmp_path / "state")
    provider.outside = outside
    checkpoint = provider.capture(repo, "s-1")
    assert isinstance(checkpoint, Checkpoint), checkpoint
    restored = tree_files(provider.materialize(repo, checkpoint, tmp_path / "restored"))
    assert ("link", "OUTSIDE LINK TARGET") not in restored.values(), restored
    assert "src/ln" not in restored  # the path changed while captured: not in it
