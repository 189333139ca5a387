"""The guarded replace, for real: a writer process racing each replacement, and SIGKILL drills.

The invariant is "zero lost outside writes": in every round the outside writer writes once, so
whatever the interleaving, its content must be on disk when the round ends (a write before the
exchange must make the replace refuse; a write after it lands over the new content). The negative
control is today's redo: check the before-state, then ``write_replace`` (atomic rename, no CAS);
the same race makes it lose writes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from maka_core import failpoints
from maka_core.tools.base import FileIdentity, ToolRefusal
from maka_core.tools.beneath import locate, write_replace
from maka_core.tools.guarded_replace import GuardedReplace, guarded_replace, side_name

ROOT = Path(__file__).resolve().parents[1]
BEFORE = b"before-state: the file as T1 recorded it\n"
NEW = b"the interrupted write's content, redone\n"


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if ".maka-" in p.name)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "f.txt").write_bytes(BEFORE)
    (root / "f.txt").chmod(0o640)
    return root


def test_replaces_only_the_recorded_before_state(root: Path) -> None:
    before = FileIdentity.of(BEFORE)
    assert guarded_replace(str(root), "f.txt", before, NEW) == GuardedReplace(outcome="replaced")
    assert (root / "f.txt").read_bytes() == NEW and (root / "f.txt").stat().st_mode & 0o777 == 0o640
    # Now the target is not the before-state: refused, nothing changed.
    refused = guarded_replace(str(root), "f.txt", before, b"other\n")
    assert refused.code == "target_diverged" and refused.observed == FileIdentity.of(NEW)
    assert (root / "f.txt").read_bytes() == NEW and leftovers(root) == []
    # An absent before-state: created only while absent.
    assert guarded_replace(str(root), "new.txt", None, NEW).outcome == "created"
    assert guarded_replace(str(root), "new.txt", None, b"x").code == "target_diverged"
    assert (root / "new.txt").read_bytes() == NEW and leftovers(root) == []
    # The path rules of every file write hold: no symlink target, no .git, nothing outside.
    (root / "link").symlink_to("f.txt")
    for rel, code in (
        ("link", "path_is_symlink"),
        (".git/config", "protected_path"),
        ("../x", "path_outside_workspace"),
    ):
        with pytest.raises(ToolRefusal) as refusal:
            guarded_replace(str(root), rel, before, NEW)
        assert refusal.value.code == code


def test_a_process_holding_the_target_open_makes_it_refuse(root: Path) -> None:
    hold = "import sys, time; f = open(sys.argv[1], 'r+b'); print('open', flush=True); time.sleep(60)"
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(root / "f.txt")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        result = guarded_replace(str(root), "f.txt", FileIdentity.of(BEFORE), NEW)
        assert result.code == "target_in_use"
        assert (root / "f.txt").read_bytes() == BEFORE and leftovers(root) == []
    finally:
        holder.kill()
        holder.wait()
    assert guarded_replace(str(root), "f.txt", FileIdentity.of(BEFORE), NEW).outcome == "replaced"


# --- the race --------------------------------------------------------------------------------

# One write per round, after a delay the parent chooses, by rename (an editor) or in place
# through a descriptor opened before the delay (a process that holds the file open).
WRITER = r"""
import os, sys, time
path = sys.argv[1]
for line in sys.stdin:
    delay, mode, text = line.split(" ", 2)
    data = text.encode()
    if mode == "inplace":
        fd = os.open(path, os.O_WRONLY)
        print("ready", flush=True)
        time.sleep(float(delay))
        os.write(fd, data)
        os.close(fd)
    else:
        print("ready", flush=True)
        time.sleep(float(delay))
        tmp = path + ".w"
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.rename(tmp, path)
    print("done", flush=True)
"""


def naive_redo(root: str, rel: str, before: FileIdentity, data: bytes) -> GuardedReplace:
    """Today's redo (negative control): compare, then an atomic rename that replaces whatever is there."""
    with locate(root, rel, for_write=True) as target:
        assert target.dir_fd is not None
        fd = os.open(target.name, os.O_RDONLY, dir_fd=target.dir_fd)
        try:
            current = FileIdentity.of(os.read(fd, 1 << 20))
        finally:
            os.close(fd)
        if current != before:
            return GuardedReplace(code="target_diverged")
        write_replace(target.dir_fd, target.name, data)
    return GuardedReplace(outcome="replaced")


def race(root: Path, redo, rounds: int) -> dict[str, int]:
    counts = {"lost": 0, "replaced": 0, "refused": 0}
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root / "f.txt")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdin is not None and writer.stdout is not None
    try:
        for i in range(rounds):
            (root / "f.txt").write_bytes(BEFORE)
            outside = f"outside write {i:06d}".ljust(len(BEFORE) - 1) + "\n"
            # Delays around the replace's own duration (a few ms), so writes fall on both sides.
            delay = (i % 13) * 0.0004
            writer.stdin.write(f"{delay} {'inplace' if i % 2 else 'rename'} {outside}")
            writer.stdin.flush()
            assert writer.stdout.readline() == "ready\n"
            result = redo(str(root), "f.txt", FileIdentity.of(BEFORE), NEW)
            assert writer.stdout.readline() == "done\n"
            counts["replaced" if result.done else "refused"] += 1
            counts["lost"] += (root / "f.txt").read_bytes() != outside.encode()
    finally:
        writer.kill()
        writer.wait()
    return counts


def test_a_racing_outside_writer_never_loses_a_write(root: Path) -> None:
    control = {"lost": 0}
    start = time.monotonic()
    while not control["lost"] and time.monotonic() - start < 60:  # the machine may be busy
        control = race(root, naive_redo, 200)
    assert control["lost"] > 0, f"the naive redo never lost a write: the race proves nothing ({control})"
    guarded = race(root, guarded_replace, 600)
    print("control", control, "guarded", guarded)
    assert guarded["lost"] == 0, guarded
    assert guarded["replaced"] > 0 and guarded["refused"] > 0  # both sides of the race were reached
    assert leftovers(root) == []


# --- crash drills ----------------------------------------------------------------------------

CHILD = """
import sys
from maka_core.tools.base import FileIdentity
from maka_core.tools.guarded_replace import guarded_replace
print(guarded_replace(sys.argv[1], "f.txt", FileIdentity.of(sys.argv[2].encode()), sys.argv[3].encode()))
"""


def kill_at(point: str, root: Path) -> None:
    assert point in failpoints.CHECKPOINT
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), BEFORE.decode(), NEW.decode()],
        env={**os.environ, "MAKA_FAILPOINT": point}, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == -9, proc.stderr


#: The failpoints these drills kill at (tests/test_git_checkpoints.py checks the catalog is covered).
POINTS = ("guarded_replace_before_exchange", "guarded_replace_after_exchange")


@pytest.mark.parametrize("point", POINTS)
def test_killed_mid_replace_it_leaves_old_or_new_and_the_next_call_repairs(point: str, root: Path) -> None:
    kill_at(point, root)
    side = side_name("f.txt", FileIdentity.of(NEW))
    assert leftovers(root) == [side]
    content = (root / "f.txt").read_bytes()
    assert content == (BEFORE if point == "guarded_replace_before_exchange" else NEW)
    assert (root / side).read_bytes() == (NEW if point == "guarded_replace_before_exchange" else BEFORE)
    again = guarded_replace(str(root), "f.txt", FileIdentity.of(BEFORE), NEW)
    assert again.outcome == ("replaced" if point == "guarded_replace_before_exchange" else "repaired")
    assert (root / "f.txt").read_bytes() == NEW and leftovers(root) == []


@pytest.mark.parametrize("point", POINTS)
def test_an_outside_write_after_the_crash_is_never_lost(point: str, root: Path) -> None:
    kill_at(point, root)
    (root / "f.txt").write_bytes(b"written by the user after the crash\n")
    again = guarded_replace(str(root), "f.txt", FileIdentity.of(BEFORE), NEW)
    assert not again.done
    assert (root / "f.txt").read_bytes() == b"written by the user after the crash\n"
    if point == "guarded_replace_before_exchange":
        assert again.code == "target_diverged" and leftovers(root) == []  # only our own side file went
    else:
        # The side file holds the before-state the crash swapped out: kept, since nothing proves
        # who still needs it; the refusal names it.
        assert again.code == "redo_leftover_unresolved" and len(leftovers(root)) == 1


# --- an outside object that is not a file within the limit -------------------------------------

OUTSIDE_KINDS = ("symlink", "folder", "oversize")
SMALL_LIMIT = 1024


def swap_in_outside(root: Path, kind: str) -> None:
    """An outside process replaces the target by rename, as ``ln -sf`` or ``rm && mv`` would."""
    staged = root / "staged"
    if kind == "symlink":
        staged.symlink_to("/etc/hostname")
    elif kind == "folder":
        staged.mkdir()
        (staged / "inner.txt").write_bytes(b"the user's folder\n")
        (root / "f.txt").unlink()  # a folder cannot be renamed over a file
    else:
        staged.write_bytes(b"x" * (SMALL_LIMIT * 4))
    os.rename(staged, root / "f.txt")


def assert_outside_back(root: Path, kind: str) -> None:
    target = root / "f.txt"
    if kind == "symlink":
        assert target.is_symlink() and os.readlink(target) == "/etc/hostname"
    elif kind == "folder":
        assert target.is_dir() and (target / "inner.txt").read_bytes() == b"the user's folder\n"
    else:
        assert not target.is_symlink() and target.read_bytes() == b"x" * (SMALL_LIMIT * 4)
    assert leftovers(root) == [], f"a side file hides something: {leftovers(root)}"


@pytest.mark.parametrize("kind", OUTSIDE_KINDS)
def test_an_outside_symlink_folder_or_large_file_racing_the_exchange_is_put_back(
    kind: str, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race made deterministic: the outside replacement lands at the last instant before the
    # exchange (the failpoint's place), so the exchange swaps it out and the check must undo it.
    real_hit = failpoints.hit

    def racing_hit(name: str, tag: str | None = None) -> None:
        if name == "guarded_replace_before_exchange":
            swap_in_outside(root, kind)
        real_hit(name, tag)

    monkeypatch.setattr(failpoints, "hit", racing_hit)
    result = guarded_replace(str(root), "f.txt", FileIdentity.of(BEFORE), NEW, max_bytes=SMALL_LIMIT)
    assert result.code == "target_diverged" and result.observed is None, result
    assert_outside_back(root, kind)


RACING_CHILD = """
import sys
from pathlib import Path
from maka_core import failpoints
from maka_core.tools.base import FileIdentity
from maka_core.tools.guarded_replace import guarded_replace
from tests.test_guarded_replace import SMALL_LIMIT, swap_in_outside
root, kind = Path(sys.argv[1]), sys.argv[2]
real_hit = failpoints.hit
def racing_hit(name, tag=None):
    if name == "guarded_replace_before_exchange":
        swap_in_outside(root, kind)
    real_hit(name, tag)
failpoints.hit = racing_hit
guarded_replace(str(root), "f.txt", FileIdentity.of(sys.argv[3].encode()), sys.argv[4].encode(),
                max_bytes=SMALL_LIMIT)
"""


@pytest.mark.parametrize("kind", OUTSIDE_KINDS)
def test_killed_after_swapping_out_an_outside_object_the_next_call_puts_it_back(
    kind: str, root: Path
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", RACING_CHILD, str(root), kind, BEFORE.decode(), NEW.decode()],
        env={**os.environ, "MAKA_FAILPOINT": "guarded_replace_after_exchange"},
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == -9, proc.stderr
    assert (root / "f.txt").read_bytes() == NEW and len(leftovers(root)) == 1  # the outside object, hidden
    again = guarded_replace(str(root), "f.txt", FileIdentity.of(BEFORE), NEW, max_bytes=SMALL_LIMIT)
    assert again.code == "target_diverged", again
    assert_outside_back(root, kind)


FULL_DISK_CHILD = """
import errno, resource, signal, sys
from maka_core.tools.base import FileIdentity
from maka_core.tools.guarded_replace import guarded_replace
# A file-size limit below the new content: the side file's write fails part-way with EFBIG, as
# on a full disk (SIGXFSZ ignored so the write returns the error instead of killing us).
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (16, 16))
try:
    guarded_replace(sys.argv[1], "f.txt", FileIdentity.of(sys.argv[2].encode()), sys.argv[3].encode())
except OSError as exc:
    print(errno.errorcode[exc.errno])
"""


def test_a_failed_side_write_leaves_no_partial_side_file(root: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", FULL_DISK_CHILD, str(root), BEFORE.decode(), NEW.decode()],
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout == "EFBIG\n", (proc.stdout, proc.stderr)
    assert (root / "f.txt").read_bytes() == BEFORE
    assert leftovers(root) == [], "a partial side file would refuse every later redo"
    assert guarded_replace(str(root), "f.txt", FileIdentity.of(BEFORE), NEW).outcome == "replaced"
