"""The one canonical codec for RuntimeEvents, and Maka's ``canonicalArgsHash``.

``decode`` is strict (unknown keys, nulls for absent keys, non-JSON and lossy values are
refused with a stable code) and ``encode`` is the single canonical form: compact JSON in
JavaScript key order and number format, so a Maka-canonical line re-encodes to the same bytes
and ``decode(encode(e)) == e``.
"""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import ValidationError

from maka_core.errors import CodecError
from maka_core.facts import canonical_json
from maka_core.facts.events import RuntimeEvent


def _shape_error(exc: ValidationError) -> CodecError:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    code = "runtime_event_unknown_key" if first["type"] == "extra_forbidden" else "runtime_event_invalid"
    return CodecError(code, f"{where}: {first['msg']}")


def from_json_object(value: Any) -> RuntimeEvent:
    """Validate an already-parsed JSON object as a RuntimeEvent."""
    if not isinstance(value, dict):
        raise CodecError("runtime_event_invalid", "a RuntimeEvent is a JSON object")
    try:
        return RuntimeEvent.model_validate(value)
    except ValidationError as exc:
        raise _shape_error(exc) from None


def decode(line: str | bytes) -> RuntimeEvent:
    """Decode one JSON line into a RuntimeEvent.

    Numbers read as Maka's ``JSON.parse`` reads them: an integer literal past 2**53 is the
    nearest double, so a line Maka decodes is decoded here with the same value (and re-encodes,
    and hashes, as Maka would); see ``canonical_json``.

    Raises:
        CodecError: ``json_syntax``, ``lossy_json_value``, ``duplicate_json_key``,
            ``runtime_event_unknown_key`` or ``runtime_event_invalid``.
    """
    return from_json_object(canonical_json.loads(line))


def encode(event: RuntimeEvent) -> str:
    """The canonical JSON text of an event (no trailing newline)."""
    return canonical_json.dumps(event.to_wire())


def digest(text: str | bytes) -> str:
    """``sha256:<hex>`` of UTF-8 text or bytes: the digest form every Maka fact uses."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_args_hash(tool_name: str, args: Any) -> str:
    """Maka's ``t1_after_preflight_v1`` identity of one call.

    The sha256 of ``{"args": ..., "toolName": ...}`` in the reference's frozen "mainline v1"
    form (reference ``tool-args-identity.ts``): object keys sorted, ``__proto__`` keys
    dropped (JavaScript's setter swallowed them), and arrays held under a ``required`` or
    ``enum`` key sorted by ``localeCompare`` of their items' JSON, so the same call hashes the
    same in both implementations.

    Args decoded from a ledger line already hold the doubles ``JSON.parse`` gave, so their hash
    is Maka's. Args built in Python are held to the encoder's rule: an ``int`` that no double
    equals is refused, not rounded, because the call would then be identified by a number other
    than the one the tool receives.

    Raises:
        ValueError: the tool name is empty (the reference gives such a call no identity).
        CodecError: ``args`` is not a strict JSON value.
    """
    if not tool_name:
        raise ValueError("tool argument identity requires a tool name")
    canonical_json.check(args)
    body = {"args": _mainline_v1(args, "args"), "toolName": tool_name}
    return digest(canonical_json.dumps(body))


_SORTED_ARRAY_KEYS = frozenset({"required", "enum"})


def _mainline_v1(value: Any, parent_key: str | None) -> Any:
    if isinstance(value, dict):
        return {k: _mainline_v1(v, k) for k, v in value.items() if k != "__proto__"}
    if isinstance(value, list):
        items = [_mainline_v1(item, None) for item in value]
        if parent_key in _SORTED_ARRAY_KEYS:
            # Stable, like Array.prototype.sort: items that collate equal keep their order.
            items.sort(key=lambda item: _collation_key(canonical_json.dumps(item)))
        return items
    return value


# ICU root collation (what Node's ``localeCompare`` uses) for ASCII: controls are ignorable,
# whitespace, then punctuation and symbols in this order, then digits, then letters with case
# a tertiary difference (lower before upper). Other characters follow by code point: an
# approximation that only matters for non-ASCII members of ``required``/``enum`` arrays.
_VARIABLE_ORDER = "\t\n\v\f\r _-,;:!?.'\"()[]{}@*/\\&#%`^+<=>|~$0123456789"
_PRIMARY: dict[str, int] = {ch: i for i, ch in enumerate(_VARIABLE_ORDER)}
for _i, _letter in enumerate("abcdefghijklmnopqrstuvwxyz"):
    _PRIMARY[_letter] = _PRIMARY[_letter.upper()] = len(_VARIABLE_ORDER) + _i


def _collation_key(text: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    primary: list[int] = []
    tertiary: list[int] = []
    for ch in text:
        code = ord(ch)
        if (code < 0x20 and ch not in "\t\n\v\f\r") or code == 0x7F:
            continue
        weight = _PRIMARY.get(ch)
        primary.append(weight if weight is not None else 0x1000 + code)
        tertiary.append(1 if ch.isascii() and ch.isupper() else 0)
    return tuple(primary), tuple(tertiary)
