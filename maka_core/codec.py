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

from maka_core import canonical_json
from maka_core.errors import CodecError
from maka_core.events import RuntimeEvent


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
    """Maka's ``t1_after_preflight_v1`` identity of one call: sha256 of canonical
    ``{"args": args, "toolName": name}``, so the same call hashes the same in both
    implementations."""
    return digest(canonical_json.dumps({"args": args, "toolName": tool_name}))
