"""The RuntimeEvent codec: Maka's exact wire shape, strict decoding, canonical bytes, args identity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maka_core.errors import CodecError
from maka_core.facts import codec
from maka_core.facts.events import (
    Actions,
    FunctionCallContent,
    FunctionResponseContent,
    Refs,
    RuntimeEvent,
    TextContent,
    ToolDispatch,
)

EXAMPLES = Path(__file__).parent / "fixtures" / "maka_examples"
USER = (
    '{"actions":{"runtimeProtocol":{"toolBoundary":"t1_after_preflight_v1"}},"author":"user",'
    '"content":{"kind":"text","text":"list the files"},"id":"evt-user-1","invocationId":"inv-1",'
    '"partial":false,"role":"user","runId":"run-1","sessionId":"sess-1","ts":1767225600000,"turnId":"turn-1"}'
)


def example_lines() -> list[str]:
    lines = []
    for path in sorted(EXAMPLES.glob("*.jsonl")):
        lines += [line for line in path.read_text(encoding="utf-8").splitlines() if line]
    return lines


def test_reference_lines_re_encode_to_the_same_bytes() -> None:
    lines = example_lines()
    assert len(lines) >= 20, "the reference fixtures are missing"
    for line in lines:
        event = codec.decode(line)
        assert codec.encode(event) == line
        assert codec.decode(codec.encode(event)) == event


def test_canonical_args_hash_matches_maka() -> None:
    # The value Maka itself wrote for Bash {"command": "ls"} in every reference ledger.
    assert (
        codec.canonical_args_hash("Bash", {"command": "ls"})
        == "sha256:f93c26c33ed90b222b920cfb4fcd11d928eab4498b96b1e093db6a230bc654d1"
    )
    assert codec.canonical_args_hash("t", {"b": 1, "a": 2.0}) == codec.canonical_args_hash(
        "t", {"a": 2, "b": 1}
    )


def test_non_canonical_input_decodes_to_the_canonical_form() -> None:
    shuffled = json.dumps(dict(reversed(list(json.loads(USER).items()))), indent=2)
    assert codec.encode(codec.decode(shuffled)) == USER


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (lambda d: d.update(extra=1), "runtime_event_unknown_key"),
        (lambda d: d["content"].update(colour="red"), "runtime_event_unknown_key"),
        (lambda d: d["actions"].update(toolRecovered=True), "runtime_event_unknown_key"),
        (lambda d: d.update(branch=None), "runtime_event_invalid"),
        (lambda d: d.pop("turnId"), "runtime_event_invalid"),
        (lambda d: d.update(ts="1767225600000"), "runtime_event_invalid"),
        (lambda d: d.update(partial=0), "runtime_event_invalid"),
        (lambda d: d.update(role="robot"), "runtime_event_invalid"),
        (lambda d: d["content"].update(kind="video"), "runtime_event_invalid"),
    ],
)
def test_decoder_refuses_wrong_shapes(mutate, code: str) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(USER)
    mutate(data)
    with pytest.raises(CodecError) as err:
        codec.decode(json.dumps(data))
    assert err.value.code == code


@pytest.mark.parametrize(
    ("text", "code"),
    [
        (USER[:-5], "json_syntax"),
        ("garbage", "json_syntax"),
        (USER.replace("1767225600000", "NaN"), "lossy_json_value"),
        (USER.replace('"list the files"', '"\\ud800"'), "lossy_json_value"),
        ("[1]", "runtime_event_invalid"),
        (b"\xff\xfe", "json_syntax"),
    ],
)
def test_decoder_refuses_torn_and_lossy_lines(text: str, code: str) -> None:
    with pytest.raises(CodecError) as err:
        codec.decode(text)
    assert err.value.code == code


def test_free_form_json_is_checked_when_built_in_code() -> None:
    with pytest.raises(ValueError):
        FunctionCallContent(id="c", name="t", args={"x": float("nan")})


def test_closure_acceptance_must_stand_alone() -> None:
    data = json.loads(USER)
    data["actions"]["permissionClosureAccepted"] = {"requestId": "r", "reason": "timed_out"}
    with pytest.raises(CodecError):
        codec.decode(json.dumps(data))


def test_event_kind_and_terminal() -> None:
    lines = (EXAMPLES / "02-call-dispatch-no-response.jsonl").read_text().splitlines()
    kinds = [codec.decode(line).event_kind for line in lines]
    assert kinds == ["text", "function_call", "tool_dispatch", "error"]
    assert [codec.decode(line).is_terminal for line in lines] == [False, False, False, True]


ids = st.text(
    st.characters(min_codepoint=33, max_codepoint=0x2FFF, exclude_categories=["Cs"]), min_size=1, max_size=8
)
json_leaf = st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=6)
args = st.dictionaries(
    st.text(max_size=5), st.recursive(json_leaf, lambda i: st.lists(i, max_size=3), max_leaves=5)
)


@st.composite
def events(draw: st.DrawFn) -> RuntimeEvent:
    kind = draw(st.sampled_from(["user", "call", "dispatch", "response"]))
    base = dict(
        id=draw(ids),
        invocation_id=draw(ids),
        run_id=draw(ids),
        session_id=draw(ids),
        turn_id=draw(ids),
        ts=draw(st.integers(0, 2**53 - 1)),
        partial=False,
    )
    call_id, op = draw(ids), draw(ids)
    if kind == "user":
        return RuntimeEvent(**base, role="user", author="user", content=TextContent(text=draw(st.text())))
    if kind == "call":
        a = draw(args)
        return RuntimeEvent(
            **base,
            role="model",
            author="agent",
            content=FunctionCallContent(id=call_id, name="t", args=a),
            refs=Refs(operation_id=op, tool_call_id=call_id),
        )
    if kind == "dispatch":
        return RuntimeEvent(
            **base,
            role="system",
            author="system",
            refs=Refs(operation_id=op, tool_call_id=call_id),
            actions=Actions(
                tool_dispatch=ToolDispatch(
                    operation_id=op,
                    provider_tool_call_id=call_id,
                    tool_name="t",
                    canonical_args_hash=codec.canonical_args_hash("t", draw(args)),
                    recovery_mode="reconcile",
                )
            ),
        )
    return RuntimeEvent(
        **base,
        role="tool",
        author="tool",
        refs=Refs(operation_id=op, tool_call_id=call_id),
        content=FunctionResponseContent(
            id=call_id, name="t", result=draw(st.one_of(st.none(), args)), is_error=draw(st.booleans())
        ),
    )


@settings(max_examples=200, deadline=None)
@given(events())
def test_any_event_round_trips(event: RuntimeEvent) -> None:
    line = codec.encode(event)
    assert codec.decode(line) == event
    assert codec.encode(codec.decode(line)) == line
