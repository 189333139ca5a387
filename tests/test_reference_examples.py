"""Our Resolver, Phase 0 plan, scan and writer admission against the reference's own answers.

Each ``NN-*.jsonl`` ledger comes with ``NN-*.out.json``: what Apache Maka's code (commit
``f19eede0``) answers for it. The copies under ``tests/fixtures/maka_examples`` keep the test
from ever skipping; the shared directory (``../shared`` beside the clone, or ``MAKA_SHARED_DIR``)
is checked too when present, so a refreshed reference set is picked up without a copy.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from maka_core.facts.codec import decode, encode
from maka_core.ledger.resolver import resolve
from maka_core.ledger.resume_plan import plan_resume
from maka_core.ledger.scanner import scan, writer_admission

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "maka_examples"


def _shared_examples() -> Path:
    shared = os.environ.get("MAKA_SHARED_DIR")
    root = Path(shared) if shared else Path(__file__).resolve().parents[2] / "shared"
    return root / "reference" / "maka-examples"


def _cases(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.jsonl"))


def _load(ledger: Path) -> tuple[list[str], dict[str, Any]]:
    lines = [line for line in ledger.read_text(encoding="utf-8").splitlines() if line.strip()]
    answer = json.loads(ledger.with_name(ledger.name.removesuffix(".jsonl") + ".out.json").read_text())
    return lines, answer


def _check(ledger: Path) -> None:
    lines, answer = _load(ledger)
    events = [decode(line) for line in lines]
    assert answer["eventCount"] == len(events)
    for line, event, expected in zip(lines, events, answer["lines"], strict=True):
        assert expected["id"] == event.id
        assert (encode(event) == line) is expected["canonical"]
    assert resolve(events).to_json() == answer["recovery"]
    assert plan_resume(events).to_json() == answer["resumePlan"]
    assert writer_admission(events) == answer["writerAdmission"]
    scanner = scan(events)
    assert {
        "hasCorruption": scanner.has_corruption,
        "issues": [issue.to_json() for issue in scanner.issues],
    } == answer["ledgerScan"]


def test_fixture_copies_are_present() -> None:
    # Six ledgers, each with its answer: a missing copy would silently shrink the suite.
    assert len(_cases(FIXTURES)) == 6
    for ledger in _cases(FIXTURES):
        assert ledger.with_name(ledger.name.removesuffix(".jsonl") + ".out.json").is_file()


@pytest.mark.parametrize("ledger", _cases(FIXTURES), ids=lambda p: p.stem)
def test_fixture_example_matches_reference(ledger: Path) -> None:
    _check(ledger)


def test_shared_examples_match_reference() -> None:
    directory = _shared_examples()
    if not directory.is_dir():
        pytest.skip(f"shared reference examples not found at {directory} (set MAKA_SHARED_DIR)")
    cases = _cases(directory)
    assert cases, f"no *.jsonl ledgers in {directory}"
    for ledger in cases:
        _check(ledger)


def test_expected_high_water_mismatch_on_a_reference_ledger() -> None:
    lines, answer = _load(FIXTURES / "01-complete-call-dispatch-response.jsonl")
    events = [decode(line) for line in lines]
    plan = plan_resume(events, expected_high_water=4).to_json()
    assert plan["kind"] == "blocked"
    assert plan["rejectionReasons"] == ["runtime_offset_mismatch"]
    assert plan["diagnostics"][0]["detail"] == {
        "expectedRuntimeEventHighWater": 4,
        "actualRuntimeEventHighWater": 5,
    }
    assert plan["expectedRuntimeEventHighWater"] == 4
    # The matching high-water changes nothing but the echoed expectation.
    same = plan_resume(events, expected_high_water=5).to_json()
    assert {**same, "expectedRuntimeEventHighWater": None} == answer["resumePlan"]
