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
        "12345678901234567891",
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
