"""Checkpoint benchmark: what a Git checkpoint costs per boundary, beside a tool call without one.

Run: ``.venv/bin/python benchmarks/checkpoint_bench.py [--files 1000 10000] [--repeat 5] [--dir DIR]``.
Prints markdown. Each workspace is a real repository: 80% of its files committed, 20% untracked,
plus an ignored build folder; files of ~200 bytes in folders of 100. "first" is a capture into an
empty store with no stat cache (every file read and hashed); "incremental" changes one file and
captures again (only that file is read); "unchanged" captures with nothing changed; the baseline is
one ``write_file`` tool call (preflight + run) in the same workspace, the work a boundary follows.
``git status`` (the user's own look at the repository) is there for scale. ``diff`` compares the
workspace with a checkpoint after one change; ``verify`` re-hashes every object of a checkpoint;
``restore`` materializes it into a new folder. Medians of ``--repeat`` runs (first: one run).

The cost per boundary as wired (``runtime.workspace_continuity``): ``turn.finish_run`` on a real
SQLite ledger, one file changed by a tool call before each run ends. "run end, no checkpoint" is
the terminal fact and header alone (``settle_run``, the code before Phase 4); "run end, no Git" is
``finish_run`` in the same files without a repository (one ``rev-parse``, a ``noCheckpoint`` bundle);
"run end, checkpoint" is ``finish_run`` capturing incrementally into the terminal fact.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from maka_core.checkpoints import Checkpoint, GitCheckpointProvider  # noqa: E402
from maka_core.runtime import builders, turn  # noqa: E402
from maka_core.runtime.contracts import BeginRunInput, FinishRunInput, RunIds  # noqa: E402
from maka_core.runtime.runtime import Runtime, RuntimeSettings  # noqa: E402
from maka_core.runtime.settle import settle_run  # noqa: E402
from maka_core.store.writer import LedgerStore  # noqa: E402
from maka_core.tools.registry import default_tools  # noqa: E402
from maka_core.workspace import Workspace  # noqa: E402

GIT_ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
    "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b",
    "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b",
}  # fmt: skip


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, env=GIT_ENV, capture_output=True, text=True, check=True
    ).stdout


def make_workspace(root: Path, files: int) -> Workspace:
    root.mkdir(parents=True)
    git(root, "init", "-q")
    (root / ".gitignore").write_text("build/\n")
    tracked = int(files * 0.8)
    for i in range(files):
        folder = root / f"pkg{i // 100:04d}"
        folder.mkdir(exist_ok=True)
        (folder / f"mod{i:06d}.py").write_text(f"# module {i}\n" + "x = 1\n" * 30)
        if i + 1 == tracked:
            git(root, "add", "-A")
            git(root, "commit", "-qm", "tracked")
    (root / "build").mkdir()
    for i in range(100):
        (root / "build" / f"o{i}.o").write_bytes(b"\0" * 1000)
    ws = Workspace.open(root)
    time.sleep(0.2)  # past the racy window: the stat cache may trust every file
    return ws


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def median_ms(fn: Callable[[], object], repeat: int, before: Callable[[], object] = lambda: None) -> float:
    samples = []
    for _ in range(repeat):
        before()
        samples.append(timed(fn))
    return statistics.median(samples)


def bench(base: Path, files: int, repeat: int) -> dict[str, float]:
    ws = make_workspace(base / f"ws{files}", files)
    provider = GitCheckpointProvider(base / f"state{files}")
    write = default_tools()["write_file"]
    counter = [0]

    def tool_call() -> None:
        counter[0] += 1
        args = {"path": "pkg0000/mod000000.py", "content": f"# edit {counter[0]}\n"}
        assert write.preflight(args, ws) is None
        assert not write.run(args, ws, lambda: None).is_error

    def capture() -> Checkpoint:
        made = provider.capture(ws, "bench")
        assert isinstance(made, Checkpoint), made
        return made

    out: dict[str, float] = {}
    out["tool call (no checkpoint)"] = median_ms(tool_call, repeat)
    out["git status"] = median_ms(
        lambda: git(ws.root, "--no-optional-locks", "status", "--porcelain"), repeat
    )
    out["first capture"] = timed(capture)
    time.sleep(0.1)
    out["unchanged capture"] = median_ms(capture, repeat)

    def change_one() -> None:
        tool_call()
        time.sleep(0.06)  # the changed file leaves the racy window, as between two real boundaries

    out["incremental capture (1 changed)"] = median_ms(capture, repeat, before=change_one)
    out["tool call + incremental capture"] = (
        out["tool call (no checkpoint)"] + out["incremental capture (1 changed)"]
    )
    checkpoint = capture()
    out["diff (1 changed)"] = median_ms(lambda: provider.diff(ws, checkpoint), repeat, before=change_one)
    out["verify (re-hash all objects)"] = median_ms(lambda: provider.verify(ws, checkpoint), repeat)
    dests = iter(range(repeat))
    out["restore"] = median_ms(
        lambda: provider.materialize(ws, checkpoint, base / f"r{files}-{next(dests)}"), repeat
    )
    return out


def run_end_ms(base: Path, ws: Workspace, repeat: int, *, bind: bool, tag: str) -> float:
    """Median time of one run's end (its terminal fact), a file changed by a tool before each."""
    rt = Runtime(
        LedgerStore.open(base / f"ledger-{tag}.sqlite"), settings=RuntimeSettings(maka_home=base / "home")
    )
    write = default_tools()["write_file"]
    script = {"kind": "script", "steps": [{"text": "done"}]}

    async def runs() -> list[float]:
        samples = []
        for i in range(repeat + 1):  # the first run warms the stat cache and the store
            ids = RunIds(session_id=f"bench-{tag}", turn_id=f"t{i}", run_id=f"r{i}", invocation_id=f"i{i}")
            begin = BeginRunInput(
                ids=ids, text="go", ts=i + 1, workflow_id="wf", workflow_run_id="wr", task_queue="q",
                workspace=str(ws.root), workspace_identity=ws.identity, provider=script,
            )  # fmt: skip
            await turn.begin_run(rt, begin)
            args = {"path": "pkg0000/mod000000.py", "content": f"# run {i}\n"}
            assert not write.run(args, ws, lambda: None).is_error
            time.sleep(0.06)  # out of the racy window, as between two real boundaries
            start = time.perf_counter()
            if bind:
                await turn.finish_run(rt, FinishRunInput(ids=ids, status="completed", ts=i + 2))
            else:
                terminal = builders.terminal_event(ids, "completed", i + 2)
                await rt.on_ledger(functools.partial(settle_run, rt.ledger, terminal))
            samples.append((time.perf_counter() - start) * 1000)
        return samples[1:]

    try:
        return statistics.median(asyncio.run(runs()))
    finally:
        rt.close()
        rt.ledger.close()  # type: ignore[attr-defined]


def boundary(base: Path, files: int, repeat: int) -> dict[str, float]:
    ws = make_workspace(base / f"wsb{files}", files)
    plain = base / f"plain{files}"
    shutil.copytree(ws.root, plain, ignore=shutil.ignore_patterns(".git"))
    no_git = Workspace.open(plain)
    return {
        "run end, no checkpoint (before Phase 4)": run_end_ms(
            base, ws, repeat, bind=False, tag=f"none{files}"
        ),
        "run end, no Git (noCheckpoint bundle)": run_end_ms(
            base, no_git, repeat, bind=True, tag=f"plain{files}"
        ),
        "run end, checkpoint (1 changed)": run_end_ms(base, ws, repeat, bind=True, tag=f"git{files}"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--files", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to build the workspaces (default: a temp dir)"
    )
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="maka-ckpt-bench-", dir=args.dir))
    try:
        results = {n: {**bench(base, n, args.repeat), **boundary(base, n, args.repeat)} for n in args.files}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(
        f"git {git(REPO, '--version').split()[-1]}, medians of {args.repeat} (first capture: one run), ms\n"
    )
    print("| measure | " + " | ".join(f"{n:,} files" for n in args.files) + " |")
    print("|---|" + "---:|" * len(args.files))
    for key in results[args.files[0]]:
        print(f"| {key} | " + " | ".join(f"{results[n][key]:.1f}" for n in args.files) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
