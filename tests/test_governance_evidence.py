"""Evidence predicates against real files: partial versus verified_success, and default evidence."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from maka_core.errors import MakaError
from maka_core.governance.classify import classify_operation
from maka_core.governance.evidence import (
    EvidencePredicate,
    FileAbsent,
    FileExists,
    ProbedFile,
    ResultEquals,
    ToolObservation,
    certificate_result,
    default_evidence_for,
    evaluate,
    evidence_strength,
    is_success,
    verification_status,
)
from maka_core.tools.files import WriteFileTool
from tests.builtin_classify import classify_tool_call

PREDICATES: TypeAdapter[list[EvidencePredicate]] = TypeAdapter(list[EvidencePredicate])


def workspace_probe(root: Path) -> Any:
    """Reads inside ``root`` only, never following a path out of it."""

    def probe(path: str) -> ProbedFile:
        target = (root / path).resolve()
        if not target.is_relative_to(root.resolve()):
            raise MakaError("verification_path_outside_workspace", path)
        if not target.exists():
            return ProbedFile(False)
        if target.is_file():
            return ProbedFile(True, hashlib.sha256(target.read_bytes()).hexdigest())
        return ProbedFile(True)

    return probe


def test_all_predicates_hold_is_verified_success(tmp_path: Path) -> None:
    (tmp_path / "out.txt").write_text("verified")
    predicates = PREDICATES.validate_python(
        [
            {"type": "file_exists", "path": "out.txt"},
            {"type": "file_absent", "path": "gone.txt"},
            {"type": "file_hash", "path": "out.txt", "sha256": hashlib.sha256(b"verified").hexdigest()},
            {"type": "result_equals", "path": "stats.written", "value": 8},
            {"type": "result_contains", "path": "lines.1", "value": "ok"},
            {"type": "exit_code", "value": 0},
        ]
    )
    observation = ToolObservation({"stats": {"written": 8.0}, "lines": ["a", "all ok"]}, exit_code=0)
    items = evaluate(predicates, observation, workspace_probe(tmp_path))
    assert [i.passed for i in items] == [True] * 6
    assert [i.strength for i in items] == ["state"] * 3 + ["execution"] * 3
    status = verification_status(True, items)
    assert status == "verified_success" and is_success(status)


@pytest.mark.parametrize(
    ("predicate", "result"),
    [
        ({"type": "file_exists", "path": "missing.txt"}, {}),
        ({"type": "file_absent", "path": "out.txt"}, {}),
        ({"type": "file_hash", "path": "out.txt", "sha256": "0" * 64}, {}),
        ({"type": "file_exists", "path": "../outside.txt"}, {}),
        ({"type": "result_equals", "path": "ok", "value": True}, {"ok": 1}),  # 1 is not true
        ({"type": "result_equals", "path": "ok", "value": True}, {}),
        ({"type": "result_contains", "path": "out", "value": "expected"}, {"out": "different"}),
        ({"type": "result_contains", "path": "out", "value": "1"}, {"out": 1}),
        ({"type": "exit_code", "value": 0}, {}),
    ],
)
def test_a_failed_predicate_after_a_successful_tool_is_partial(
    tmp_path: Path, predicate: dict[str, Any], result: dict[str, Any]
) -> None:
    (tmp_path / "out.txt").write_text("x")
    items = evaluate(
        PREDICATES.validate_python([predicate]), ToolObservation(result), workspace_probe(tmp_path)
    )
    assert [i.passed for i in items] == [False]
    assert verification_status(True, items) == "partial"
    assert not is_success("partial")
    if predicate.get("path") == "../outside.txt":
        assert items[0].summary == "verification_path_outside_workspace"


def test_a_failed_tool_is_failed_whatever_the_evidence() -> None:
    assert verification_status(False, ()) == "failed"


def test_file_predicates_without_a_probe_fail_rather_than_pass() -> None:
    items = evaluate([FileExists(type="file_exists", path="a")], ToolObservation({}))
    assert items[0].passed is False and items[0].summary == "verification_probe_unavailable"


def test_predicates_are_parsed_strictly() -> None:
    for bad in (
        {"type": "file_hash", "path": "a", "sha256": "sha256:" + "0" * 64},
        {"type": "file_exists", "path": ""},
        {"type": "file_exists", "path": "a", "extra": 1},
        {"type": "url_matches", "pattern": "x"},
    ):
        with pytest.raises(ValidationError):
            PREDICATES.validate_python([bad])


def test_melras_default_evidence_for_mutations() -> None:
    write = {"path": "a.txt", "content": "x"}
    # The file tools declare their derived evidence (``derived_evidence``); governance names no tool.
    declared = PREDICATES.validate_python(list(WriteFileTool.derived_evidence))
    assert default_evidence_for(classify_tool_call("write_file", write), write, derived=declared) == (
        FileExists(type="file_exists", path="a.txt"),
    )
    assert default_evidence_for(classify_tool_call("write_file", write), write) == ()
    assert default_evidence_for(classify_tool_call("read_file", {"path": "a"}), {"path": "a"}) == ()
    assert default_evidence_for(classify_tool_call("bash", {"command": "make"}), {"command": "make"}) == ()
    move = {"kind": "file", "action": "move", "path": "a", "destination": "b"}
    assert default_evidence_for(classify_operation(move), move) == (
        FileAbsent(type="file_absent", path="a"),
        FileExists(type="file_exists", path="b"),
    )
    delete = {"kind": "file", "action": "delete", "path": "a"}
    assert default_evidence_for(classify_operation(delete), delete) == (
        FileAbsent(type="file_absent", path="a"),
    )
    send = {"kind": "terminal", "action": "send", "jobId": "j"}
    assert default_evidence_for(classify_operation(send), send) == (
        ResultEquals(type="result_equals", path="sent", value=True),
    )
    run = {"kind": "terminal", "action": "run", "command": "make"}
    assert default_evidence_for(classify_operation(run), run) == ()


def test_the_policys_default_evidence_wins_and_fills_argument_templates() -> None:
    defaults = {
        "write_file": tuple(PREDICATES.validate_python([{"type": "file_absent", "path": "{{path}}.lock"}]))
    }
    write = {"path": "a.txt", "content": "x"}
    assert default_evidence_for(classify_tool_call("write_file", write), write, defaults) == (
        FileAbsent(type="file_absent", path="a.txt.lock"),
    )
    with pytest.raises(MakaError) as err:
        default_evidence_for(classify_tool_call("write_file", {"content": "x"}), {"content": "x"}, defaults)
    assert err.value.code == "evidence_template_unresolved"


def test_strength_and_certificate_results() -> None:
    assert evidence_strength("file_hash") == "state"
    assert evidence_strength("something_new") == "execution"
    assert certificate_result("partial") == "PARTIAL"
    assert certificate_result("policy_blocked") == "POLICY_BLOCKED"
    with pytest.raises(ValueError):
        certificate_result("running")
