"""The soak's checker catches each kind of fault it exists for (issue 33's negative controls).

Each control is a small crafted soak (``benchmarks/soak.py`` with the test's own script and fault):
one session calls the at-most-once ``soak_once`` after a read-only ``soak_read``, and slot 0's first
worker is armed with ``P4[soak_once]`` (the effect done, its T2 not committed). Then:

- the correct worker: the call parks, the operator bot resolves it ``applied`` from the effect log,
  the turn finishes; the checker is clean (one effect line, nothing stuck);
- that folder with the read's T2 deleted from the ledger (a writer that dropped an acknowledged T2):
  the checker reports the lost fact and ``maka ledger verify`` dirty;
- the naive worker (``tests/children/naive_worker.py``: a guard that lets the retry run it again):
  the checker reports the at-most-once call ``repeated`` (two effect lines), exit 1 with the seed;
- a bot whose resume ignores the parked call: the checker reports the session stuck.

Plus the plan's determinism: the same seed draws the same scripts and the same fault schedule.
"""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.soak import SoakConfig, run_soak
from benchmarks.soak_plan import Failpoint, fault_draws, write_scripts
from tests.drills import NAIVE_WORKER

REPO = Path(__file__).resolve().parents[1]
CRAFTED = [
    [
        {"toolCalls": [{"name": "soak_read", "args": {"tag": "read-1"}}]},
        {"toolCalls": [{"name": "soak_once", "args": {"tag": "charge-1", "sleep_ms": 200}}]},
        {"text": "charged once"},
    ]
]
SEED = 33


def crafted(**overrides: Any) -> SoakConfig:
    base: dict[str, Any] = dict(
        seed=SEED, kills=1, minutes=3.0, sessions=1, concurrency=1, workers=1, turns=1, min_turns=1,
        gap=(600.0, 600.0), scripts=CRAFTED, first_failpoint=Failpoint("P4", "soak_once", 0),
        resume_kill_p=0.0,
    )  # fmt: skip
    base.update(overrides)
    return SoakConfig(**base)


def checker(out: Path) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak_check", str(out), "--json", "--no-audit"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def kinds(report: dict[str, Any]) -> set[str]:
    return {v["kind"] for v in report["violations"]}


def test_the_same_seed_draws_the_same_workload_and_fault_schedule(tmp_path: Path) -> None:
    a, rng_a = write_scripts(7, 3, 20, tmp_path / "a")
    b, rng_b = write_scripts(7, 3, 20, tmp_path / "b")
    c, _ = write_scripts(8, 3, 20, tmp_path / "c")
    assert [p.read_text() for p in a] == [p.read_text() for p in b]
    assert [p.read_text() for p in a] != [p.read_text() for p in c]
    draws_a, draws_b = fault_draws(rng_a, 3, (0.5, 2.0), 2.0), fault_draws(rng_b, 3, (0.5, 2.0), 2.0)
    assert [next(draws_a) for _ in range(50)] == [next(draws_b) for _ in range(50)]
    tools = {c["name"] for p in a for s in json.loads(p.read_text())["steps"] for c in s.get("toolCalls", [])}
    assert tools >= {"soak_read", "soak_idem", "soak_alo", "soak_recon", "soak_once", "bash", "write_file"}
    assert random.Random(7).random() == random.Random(7).random()


@pytest.mark.slow
@pytest.mark.temporal
@pytest.mark.crash
@pytest.mark.asyncio(loop_scope="session")
async def test_a_crashed_at_most_once_call_resolved_from_the_effect_log_checks_clean_a_dropped_t2_does_not(
    temporal_server: Any, tmp_path: Path
) -> None:
    out = tmp_path / "clean"
    report = await run_soak(crafted(), out, address=temporal_server.address)
    assert report["faults"] == {"failpoint": 1}, report
    assert report["violations"] == [] and report["stuck"] == [], report
    assert report["verify"] == "clean" and report["auditDrift"] == 0, report
    decisions = [json.loads(x) for x in (out / "operator.jsonl").read_text().splitlines()]
    assert [d["decision"] for d in decisions if d.get("operationId")] == ["applied"], decisions
    logs = (out / "effects").glob("tools-*.jsonl")
    lines = [json.loads(x) for p in logs for x in p.read_text().splitlines()]
    assert sorted(ln["tag"] for ln in lines) == ["charge-1", "read-1"], lines

    # A writer that drops an acknowledged T2: the read's outcome vanishes from the ledger.
    dropped = tmp_path / "dropped"
    shutil.copytree(out, dropped, symlinks=True)
    replay = json.loads((dropped / "replay.json").read_text())
    replay["ledger"] = str(dropped / "ledger.sqlite")
    (dropped / "replay.json").write_text(json.dumps(replay))
    with sqlite3.connect(dropped / "ledger.sqlite") as db:
        for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='trigger'").fetchall():
            db.execute(f"DROP TRIGGER {name}")  # the append-only guard, which a dropping writer skips
        gone = db.execute(
            "DELETE FROM runtime_events WHERE event_kind='function_response' AND tool_call_id IN "
            "(SELECT tool_call_id FROM runtime_events "
            " WHERE event_kind='function_call' AND payload_json LIKE '%read-1%')"
        ).rowcount
    assert gone == 1
    code, report, err = checker(dropped)
    assert code == 1 and "lost_fact" in kinds(report) and report["verify"] == "dirty", report
    assert f"--seed {SEED}" in err, err


@pytest.mark.slow
@pytest.mark.temporal
@pytest.mark.crash
@pytest.mark.asyncio(loop_scope="session")
async def test_negative_control_a_worker_that_reruns_the_at_most_once_call_on_recovery_is_caught(
    temporal_server: Any, tmp_path: Path
) -> None:
    out = tmp_path / "naive"
    await run_soak(crafted(worker_entry=NAIVE_WORKER), out, address=temporal_server.address)
    code, report, err = checker(out)
    repeated = [v for v in report["violations"] if v["kind"] == "repeated"]
    assert code == 1 and repeated, report
    assert repeated[0]["tool"] == "soak_once" and repeated[0]["effects"] == 2, repeated
    assert f"--seed {SEED}" in err, err


@pytest.mark.slow
@pytest.mark.temporal
@pytest.mark.crash
@pytest.mark.asyncio(loop_scope="session")
async def test_negative_control_a_resume_that_ignores_the_parked_call_leaves_the_session_stuck(
    temporal_server: Any, tmp_path: Path
) -> None:
    out = tmp_path / "ignored"
    await run_soak(crafted(operator="resume-only"), out, address=temporal_server.address)
    code, report, _ = checker(out)
    assert code == 1 and report["violations"] == [], report
    assert [s["state"] for s in report["stuck"]] == ["parked"], report
