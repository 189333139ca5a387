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


# --- integers past 2**53 in a ledger line ------------------------------------------------------

BIG_CALL = (
    '{"author":"agent","content":{"args":{"big":9007199254740993,"huge":1000000000000000000000,'
    '"list":[12345678901234567891,-9007199254740995],"small":7},"id":"call-1","kind":"function_call",'
    '"name":"Bash"},"id":"evt-call-1","invocationId":"inv-1","partial":false,"role":"model",'
    '"runId":"run-1","sessionId":"sess-1","ts":1767225600001,"turnId":"turn-1"}'
)
BIG_ARGS_AS_JS = (
    '{"big":9007199254740992,"huge":1e+21,"list":[12345678901234567000,-9007199254740996],"small":7}'
)


def test_a_call_with_integers_past_2_53_decodes_to_the_nearest_doubles() -> None:
    """Maka's decoder sees what JSON.parse gives: the nearest double of each literal."""
    event = codec.decode(BIG_CALL)
    assert event.content is not None and event.content.kind == "function_call"
    assert event.content.args["big"] == 2**53 and event.content.args["small"] == 7
    line = codec.encode(event)
    assert line == BIG_CALL.replace(
        BIG_CALL[BIG_CALL.index('{"big"') : BIG_CALL.index(',"id"')], BIG_ARGS_AS_JS
    )
    assert codec.decode(line) == event and codec.encode(codec.decode(line)) == line


def test_args_hash_of_a_big_integer_call_is_the_hash_of_the_decoded_doubles() -> None:
    event = codec.decode(BIG_CALL)
    assert event.content is not None and event.content.kind == "function_call"
    expected = codec.digest('{"args":' + BIG_ARGS_AS_JS + ',"toolName":"Bash"}')
    assert codec.canonical_args_hash("Bash", event.content.args) == expected
    # The literal's own digits are not what either side hashes.
    assert codec.canonical_args_hash("Bash", event.content.args) != codec.digest(
        '{"args":{"big":9007199254740993},"toolName":"Bash"}'
    )


def test_args_hash_refuses_a_python_int_no_double_equals() -> None:
    """Our writers hold exact Python ints: one past 2**53 that a double cannot hold is refused
    (a BigInt to JavaScript, which JSON.stringify refuses), not silently rounded."""
    with pytest.raises(CodecError) as err:
        codec.canonical_args_hash("Bash", {"big": 2**53 + 1})
    assert err.value.code == "lossy_json_value"
    assert codec.canonical_args_hash("Bash", {"big": float(2**53)}) == codec.canonical_args_hash(
        "Bash", {"big": 2**53}
    )


@pytest.mark.skipif(__import__("shutil").which("node") is None, reason="node is not installed")
def test_big_integer_args_hash_agrees_with_node() -> None:
    """sha256 of node's JSON.stringify of the parsed args (sorted keys, as the mainline v1 form)."""
    import subprocess

    script = r"""
const crypto = require('crypto');
const e = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const sort = (v) => Array.isArray(v) ? v.map(sort) : (v && typeof v === 'object')
  ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, sort(v[k])])) : v;
const text = JSON.stringify({ args: sort(e.content.args), toolName: e.content.name });
process.stdout.write('sha256:' + crypto.createHash('sha256').update(text).digest('hex'));
"""
    theirs = subprocess.run(
        ["node", "-e", script], input=BIG_CALL, capture_output=True, text=True, check=True
    ).stdout
    event = codec.decode(BIG_CALL)
    assert event.content is not None and event.content.kind == "function_call"
    assert codec.canonical_args_hash("Bash", event.content.args) == theirs
