"""Canonical JSON: JavaScript's number format and key order, and refusal of lossy values."""

from __future__ import annotations

import json
import math
import shutil
import struct
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maka_core.errors import CodecError
from maka_core.facts import canonical_json as cj

NUMBERS = {
    1.5: "1.5",
    100.0: "100",
    1e21: "1e+21",
    1e20: "100000000000000000000",
    0.1: "0.1",
    1e-7: "1e-7",
    1.5e-7: "1.5e-7",
    0.000001: "0.000001",
    1.7976931348623157e308: "1.7976931348623157e+308",
    5e-324: "5e-324",
    -2.5: "-2.5",
    2.0**53: "9007199254740992",
    123e-20: "1.23e-18",
}


@pytest.mark.parametrize(("value", "text"), NUMBERS.items())
def test_numbers_print_as_javascript_does(value: float, text: str) -> None:
    assert cj.format_number(value) == text


def test_keys_order_as_javascript_does() -> None:
    # Integer-like keys ascending first, then UTF-16 code-unit order (astral chars sort by surrogates,
    # so U+1F600 comes before U+FF5E even though its code point is larger).
    value = {"b": 1, "a": 2, "10": 3, "2": 4, "01": 5, "\uff5e": 6, "\U0001f600": 7, "4294967295": 8}
    assert list(json.loads(cj.dumps(value))) == [
        "2",
        "10",
        "01",
        "4294967295",
        "a",
        "b",
        "\U0001f600",
        "\uff5e",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "NaN",
        "Infinity",
        "-0",
        "-0.0",
        "1e400",
        "1e-400",
        '{"a":1,"a":2}',
        '"\\ud800"',
        "1" + "0" * 400,
    ],
)
def test_lossy_or_invalid_values_are_refused(text: str) -> None:
    with pytest.raises(CodecError) as err:
        cj.loads(text)
    assert err.value.code in {"lossy_json_value", "duplicate_json_key", "json_syntax"}


@pytest.mark.parametrize("value", [math.nan, math.inf, -0.0, (1, 2), {1: "x"}, b"x", "\udc00", 2**64 + 1])
def test_encoder_refuses_non_json_values(value: object) -> None:
    with pytest.raises(CodecError):
        cj.dumps({"v": value})


@pytest.mark.parametrize(
    ("literal", "value", "text"),
    [
        ("9007199254740993", 2.0**53, "9007199254740992"),
        ("-9007199254740993", -(2.0**53), "-9007199254740992"),
        ("9007199254740995", 2.0**53 + 4, "9007199254740996"),
        ("9999999999999999", 1e16, "10000000000000000"),
        ("12345678901234567891", 12345678901234567891.0, "12345678901234567000"),
        ("1000000000000000000000", 1e21, "1e+21"),
        ("123456789012345678901234567890", 1.2345678901234568e29, "1.2345678901234568e+29"),
    ],
)
def test_integer_literals_past_2_53_read_as_the_nearest_double(literal: str, value: float, text: str) -> None:
    """JSON.parse reads every number literal as the nearest double (round half to even)."""
    parsed = cj.loads(f'{{"n":{literal}}}')["n"]
    assert isinstance(parsed, float) and parsed == value
    assert cj.dumps(parsed) == text
    assert cj.loads(text) == parsed


def test_safe_integer_literals_stay_exact_ints() -> None:
    assert cj.loads("[9007199254740991, -9007199254740991, 999999999999999, 0]") == [
        2**53 - 1,
        -(2**53) + 1,
        999999999999999,
        0,
    ]
    assert all(type(v) is int for v in cj.loads("[9007199254740991, 123456789012345]"))


@pytest.mark.parametrize("value", [2**53 + 1, -(2**53) - 1, 12345678901234567891])
def test_python_ints_a_double_cannot_hold_are_still_refused_on_encode(value: int) -> None:
    """Writers hold Python values: an int past 2**53 that no double equals is JavaScript's BigInt,
    which JSON.stringify refuses; rounding it would record another number than the one held."""
    with pytest.raises(CodecError) as err:
        cj.dumps({"n": value})
    assert err.value.code == "lossy_json_value"
    # Negative control: the same magnitude held exactly by a double is written.
    assert cj.dumps({"n": 2**53 + 2}) == '{"n":9007199254740994}'


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_big_integer_literals_agree_with_a_real_javascript_engine() -> None:
    """node's JSON.parse then JSON.stringify gives our bytes for integer literals of every size."""
    import random

    rng = random.Random(11)
    literals = [str(rng.randint(2**53, 10**d)) for d in range(16, 40) for _ in range(20)]
    literals += ["-" + x for x in literals[::7]] + ["9007199254740993", "18014398509481985"]
    text = "[" + ",".join(literals) + "]"
    script = "process.stdout.write(JSON.stringify(JSON.parse(require('fs').readFileSync(0,'utf8'))))"
    theirs = subprocess.run(
        ["node", "-e", script], input=text, capture_output=True, text=True, check=True
    ).stdout
    assert cj.dumps(cj.loads(text)) == theirs


def test_integral_doubles_are_one_number() -> None:
    assert cj.loads("[1.0, 2e0, 9007199254740993e0]") == [1, 2, 9007199254740992]
    assert cj.dumps(cj.loads("[1.0, 2e0]")) == "[1,2]"


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False).filter(
        lambda f: not (f == 0 and math.copysign(1, f) < 0)
    )
    | st.text(st.characters(exclude_categories=["Cs"])),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_round_trip_is_lossless_and_stable(value: object) -> None:
    text = cj.dumps(value)
    again = cj.loads(text)
    assert again == value
    assert cj.dumps(again) == text


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_agrees_with_a_real_javascript_engine() -> None:
    """Cross-check against node: JSON.stringify of the parsed value must equal our bytes."""
    import random

    rng = random.Random(7)
    doubles = []
    while len(doubles) < 2000:
        d = struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]
        if math.isfinite(d) and not (d == 0 and math.copysign(1, d) < 0):
            doubles.append(d)
    doubles += [rng.uniform(-1e6, 1e6) for _ in range(500)] + [
        rng.randint(-(10**6), 10**6) / 1000 for _ in range(500)
    ]
    value = {
        "numbers": doubles,
        "keys": {k: i for i, k in enumerate(["z", "1", "b", "\u00e9", "0", "10", "A"])},
    }
    ours = cj.dumps(value)
    script = (
        "const v=JSON.parse(require('fs').readFileSync(0,'utf8'));process.stdout.write(JSON.stringify(v))"
    )
    theirs = subprocess.run(
        ["node", "-e", script], input=ours, capture_output=True, text=True, check=True
    ).stdout
    assert theirs == ours


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_fast_path_equals_the_exact_encoder(value: object) -> None:
    exact: list[str] = []
    cj._encode(value, exact, "$")
    assert cj.dumps(value) == "".join(exact)
