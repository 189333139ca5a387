"""Canonical JSON with JavaScript's semantics, so bytes written here equal bytes Maka writes.

Maka is JavaScript, so wire compatibility means its JSON model: every number is an IEEE-754
double printed in JavaScript's shortest form (``Number.prototype.toString``), and object keys
come out as JavaScript orders them: integer-like keys ascending, then the rest in UTF-16
code-unit order.

Two directions, two rules. Parsing JSON text (``loads``: ledger lines, provider arguments) reads
numbers as ``JSON.parse`` does: every literal is the nearest double, so an integer literal past
2**53 becomes that double (``9007199254740993`` reads as ``9007199254740992``) and a ledger line
Maka could decode is decoded here too, with the same value, the same re-encoded bytes and the
same ``canonicalArgsHash``. Encoding Python values (``check``/``dumps``: every writer) refuses
what would not survive the wire: NaN, infinities, -0, lone surrogates, non-JSON objects, and a
Python ``int`` a double cannot hold. That last one has no JavaScript number counterpart (it is
JavaScript's BigInt, which ``JSON.stringify`` refuses); writing it would record a value other
than the one the tool or caller held, so our writers stay as strict as Maka's. Literals that
overflow a double, -0 and non-zero literals that underflow to 0 are refused on parse as well:
they would not come back as the number the text spells.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

from maka_core.errors import CodecError

JsonValue = Any  # dict[str, JsonValue] | list[JsonValue] | str | int | float | bool | None

MAX_SAFE_INTEGER = 2**53 - 1
_ARRAY_INDEX_MAX = 2**32 - 2
_INDEX_RE = re.compile(r"0|[1-9][0-9]*")
_NONZERO_DIGIT = re.compile(r"[1-9]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_FIFTEEN_DIGITS = 10**15


def _number_from_literal(text: str) -> int | float:
    value = float(text)
    if math.isinf(value):
        raise CodecError("lossy_json_value", f"number {text} overflows a double")
    mantissa = text.lower().split("e")[0]
    if value == 0.0:
        if text.startswith("-"):
            raise CodecError("lossy_json_value", "-0 does not survive a JSON round trip")
        if _NONZERO_DIGIT.search(mantissa):
            raise CodecError("lossy_json_value", f"number {text} underflows to 0")
    return _normalize_double(value, text)


def _parse_int(text: str) -> int | float:
    """An integer literal as ``JSON.parse`` reads it: exact within 2**53, else the nearest double."""
    if len(text.lstrip("-")) <= 15:
        # Fifteen digits stay below 2**53: the integer is exact.
        value = int(text)
        if value == 0 and text.startswith("-"):
            raise CodecError("lossy_json_value", "-0 does not survive a JSON round trip")
        return value
    # float() of the decimal text is correctly rounded (round half to even), as ECMA-262 requires
    # of JSON.parse; it also avoids int()'s digit limit on very long literals.
    as_double = float(text)
    if math.isinf(as_double):
        raise CodecError("lossy_json_value", f"integer {text[:32]} overflows a double")
    return _normalize_double(as_double)


def _normalize_double(value: float, text: str = "") -> int | float:
    # JavaScript has one number type: an integral double within the safe range is the
    # same value as the integer, so hold it as int (equal, hashable, printed identically).
    if value.is_integer() and abs(value) <= MAX_SAFE_INTEGER:
        return int(value)
    return value


def _reject_constant(name: str) -> Any:
    raise CodecError("lossy_json_value", f"{name} is not JSON")


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise CodecError("duplicate_json_key", f"duplicate object key {key!r}")
        out[key] = value
    return out


def loads(text: str | bytes) -> JsonValue:
    """Parse one JSON text as ``JSON.parse`` would, refusing what it would not give back.

    Numbers are doubles (an integer literal past 2**53 is the nearest one); NaN, infinities,
    overflow, -0, underflow to 0, lone surrogates and repeated keys are refused.

    Raises:
        CodecError: ``json_syntax`` for text that is not JSON, ``lossy_json_value`` for a value
            that would not survive a round trip, ``duplicate_json_key`` for a repeated key.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CodecError("json_syntax", f"not UTF-8: {exc}") from None
    try:
        value = json.loads(
            text,
            parse_int=_parse_int,
            parse_float=_number_from_literal,
            parse_constant=_reject_constant,
            object_pairs_hook=_reject_duplicate_keys,
        )
    except CodecError:
        raise
    except (ValueError, RecursionError) as exc:
        raise CodecError("json_syntax", str(exc)) from None
    check(value)
    return value


def check(value: JsonValue, path: str = "$") -> JsonValue:
    """Raise unless ``value`` is a JSON value that survives a JavaScript round trip."""
    _scan_or_raise(value, path)
    return value


class _Lossy(Exception):
    """Internal: ``_scan`` met a value that is not lossless JSON (``_check_at`` says where)."""


def _scan_or_raise(value: JsonValue, path: str) -> bool:
    try:
        return _scan(value)
    except (_Lossy, RecursionError):
        _check_at(value, path)  # the slow walk that names the offending path
        raise CodecError("lossy_json_value", f"not lossless JSON at {path}") from None


def _scan(value: JsonValue) -> bool:
    """Validate ``value`` as ``check`` does, without building paths, in one walk; return True when
    the C encoder's output might differ from JavaScript's (a float, an integer past 15 digits, an
    integer-like or non-ASCII key, a character at or past U+D800), so ``dumps`` takes the exact
    encoder only then. This walk is the hot path of every commit: paths are built only on failure."""
    if value is None or value is True or value is False:
        return False
    if isinstance(value, str):
        if value.isascii():
            return False
        if _LONE_SURROGATE.search(value):
            raise _Lossy
        return max(value) >= "\ud800"
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER and float(value) != value:
            raise _Lossy
        return abs(value) >= _FIFTEEN_DIGITS
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value) or (value == 0.0 and math.copysign(1.0, value) < 0):
            raise _Lossy
        return True
    if isinstance(value, dict):
        needs = False
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Lossy
            if not key.isascii():
                if _LONE_SURROGATE.search(key):
                    raise _Lossy
                needs = True
            elif key.isdigit():
                needs = True  # JavaScript orders array-index keys first
            if _scan(item):
                needs = True
        return needs
    if isinstance(value, list):
        needs = False
        for item in value:
            if _scan(item):
                needs = True
        return needs
    raise _Lossy


def _check_at(value: JsonValue, path: str) -> JsonValue:
    """``check`` with the offending path in the error (run only once ``_scan`` has failed)."""
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        if _LONE_SURROGATE.search(value):
            raise CodecError("lossy_json_value", f"lone surrogate in string at {path}")
        return value
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER and float(value) != value:
            raise CodecError("lossy_json_value", f"integer at {path} is not exactly representable")
        return value
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise CodecError("lossy_json_value", f"non-finite number at {path}")
        if value == 0.0 and math.copysign(1.0, value) < 0:
            raise CodecError("lossy_json_value", f"-0 at {path}")
        return value
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise CodecError("lossy_json_value", f"non-string key at {path}")
            if _LONE_SURROGATE.search(key):
                raise CodecError("lossy_json_value", f"lone surrogate in key at {path}")
            _check_at(item, f"{path}.{key}")
        return value
    if isinstance(value, list):
        for index, item in enumerate(value):
            _check_at(item, f"{path}[{index}]")
        return value
    raise CodecError("lossy_json_value", f"{type(value).__name__} at {path} is not JSON")


def _is_array_index(key: str) -> bool:
    return _INDEX_RE.fullmatch(key) is not None and int(key) <= _ARRAY_INDEX_MAX


def js_key_order(keys: Any) -> list[str]:
    """Order keys as JavaScript does: array indices ascending, then UTF-16 code-unit order."""
    indices = sorted((k for k in keys if _is_array_index(k)), key=int)
    names = sorted((k for k in keys if not _is_array_index(k)), key=lambda k: k.encode("utf-16-be"))
    return indices + names


def format_number(value: int | float) -> str:
    """``Number.prototype.toString`` for a finite double (ECMA-262 Number::toString)."""
    if isinstance(value, bool):
        raise CodecError("lossy_json_value", "bool is not a number")
    if isinstance(value, int):
        if abs(value) <= MAX_SAFE_INTEGER:
            return str(value)
        value = float(value)
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    # repr() yields the shortest round-tripping digits, as ECMA-262 requires; Decimal splits
    # them into a digit string and the decimal point's position n.
    _, digit_tuple, exponent = Decimal(repr(abs(value))).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    n = len(digits) + int(exponent)
    k = len(digits)
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + digits
    exp = n - 1
    exp_text = f"e+{exp}" if exp >= 0 else f"e-{-exp}"
    if k == 1:
        return sign + digits + exp_text
    return sign + digits[0] + "." + digits[1:] + exp_text


def _encode_string(value: str) -> str:
    # json.dumps with ensure_ascii=False escapes exactly JSON.stringify's set
    # (quote, backslash, and U+0000-U+001F with the short forms), lower-case hex.
    return json.dumps(value, ensure_ascii=False)


def _encode(value: JsonValue, out: list[str], path: str) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        check(value, path)
        out.append(_encode_string(value))
    elif isinstance(value, (int, float)):
        check(value, path)
        out.append(format_number(value))
    elif isinstance(value, dict):
        out.append("{")
        first = True
        for key in js_key_order(value.keys() if all(isinstance(k, str) for k in value) else _bad_keys(path)):
            if not first:
                out.append(",")
            first = False
            check(key, path)
            out.append(_encode_string(key))
            out.append(":")
            _encode(value[key], out, f"{path}.{key}")
        out.append("}")
    elif isinstance(value, list):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _encode(item, out, f"{path}[{index}]")
        out.append("]")
    else:
        raise CodecError("lossy_json_value", f"{type(value).__name__} at {path} is not JSON")


def _bad_keys(path: str) -> Any:
    raise CodecError("lossy_json_value", f"non-string key at {path}")


def dumps(value: JsonValue) -> str:
    """Canonical compact JSON text of a value, in JavaScript's key order and number format."""
    return dumps_plain(value)[0]


def dumps_plain(value: JsonValue) -> tuple[str, bool]:
    """``dumps``, and whether ``value`` is plain: only objects with ASCII non-index keys, arrays,
    strings below U+D800, integers below 15 digits, booleans and null. ``loads`` of a plain value's
    text gives back a value equal to it, of the same JSON types, so a caller that would parse the
    text again only to compare may use ``value`` itself."""
    # Fast path: the C encoder with sorted keys is already JavaScript's output unless the value holds
    # something it might format or order differently (``_scan`` says so while it validates).
    if not _scan_or_raise(value, "$"):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True), True
    out: list[str] = []
    _encode(value, out, "$")
    return "".join(out), False
