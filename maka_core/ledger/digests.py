"""Immutable prefixes, boundary cursors and the continuation digests (PR B).

A continuation is anchored to an immutable prefix of its source run, named by the ledger's
event sequence (never an event count) and authenticated by a domain-separated, length-framed
SHA-256 over the canonical events. A cursor lists the prefixes of every generation, oldest
first; its manifest digest is the key the continuation claim is stored under. The recipes are
the reference's byte for byte (``maka-continuation-facts.md`` §5.1-§5.4, §5.7), so a boundary
digested here is the boundary Maka digests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from maka_core.errors import CodecError, MakaError
from maka_core.facts import canonical_json
from maka_core.facts.codec import from_json_object
from maka_core.facts.events import RuntimeEvent

PREFIX_DOMAIN: Final[bytes] = b"maka.runtime-prefix.v1"
MANIFEST_DOMAIN: Final[bytes] = b"maka.runtime-boundary-manifest.v1"
SEGMENT_PROTOCOL: Final[str] = "runtime_prefix_segment_v1"
CURSOR_PROTOCOL: Final[str] = "runtime_boundary_cursor_v1"
REPLAY_PROTOCOL: Final[str] = "provider_replay_plan_v1"
PROVIDER_PROJECTION_VERSION: Final[int] = 1
_MAX_SAFE = 2**53 - 1


class PrefixUnreadable(MakaError):
    """An immutable prefix cannot be read (missing, empty, beyond the ledger, undecodable,
    partial or of mixed identity)."""

    default_code = "runtime_prefix_unreadable"


@dataclass(frozen=True)
class Identity:
    """The execution identity of a prefix: the four ids of its first event."""

    session_id: str
    invocation_id: str
    run_id: str
    turn_id: str

    def to_json(self) -> dict[str, str]:
        return {
            "sessionId": self.session_id,
            "invocationId": self.invocation_id,
            "runId": self.run_id,
            "turnId": self.turn_id,
        }


@dataclass(frozen=True)
class Prefix:
    """An immutable run prefix: events 1..n of one run, their canonical forms and its digest."""

    identity: Identity
    events: tuple[RuntimeEvent, ...]
    canonical: tuple[dict[str, Any], ...]
    digest: str

    @property
    def last_event_seq(self) -> int:
        return len(self.events)

    def segment(self) -> dict[str, Any]:
        """The cursor segment naming this prefix."""
        n = len(self.events)
        return {
            "protocol": SEGMENT_PROTOCOL,
            "identity": self.identity.to_json(),
            "position": {"lastEventSeq": n, "eventCount": n, "lastEventId": self.events[-1].id},
            "prefixDigest": self.digest,
        }


def canonical_event(event: RuntimeEvent) -> dict[str, Any]:
    """The canonical wire object of an event, as the reference's decoder rebuilds it.

    Text content drops ``providerOptions`` (accepted but not kept) and an ``automation`` origin
    reads as ``legacy_automation``; every other field is kept as given.
    """
    wire = event.to_wire()
    content = wire.get("content")
    if isinstance(content, dict) and content.get("kind") == "text":
        content = dict(content)
        content.pop("providerOptions", None)
        origin = content.get("origin")
        if isinstance(origin, dict) and origin.get("kind") == "automation":
            content["origin"] = {**origin, "kind": "legacy_automation"}
        wire["content"] = content
    return wire


def _hashed_form(canonical: dict[str, Any]) -> dict[str, Any]:
    # The released bytes of a legacy automation origin are ``automation``: hashing them so
    # keeps digests of prefixes written before the rename stable.
    content = canonical.get("content")
    if isinstance(content, dict) and content.get("kind") == "text":
        origin = content.get("origin")
        if isinstance(origin, dict) and origin.get("kind") == "legacy_automation":
            return {**canonical, "content": {**content, "origin": {**origin, "kind": "automation"}}}
    return canonical


def _lp(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def _stable(value: Any) -> bytes:
    return canonical_json.dumps(value).encode("utf-8")


def prefix_digest(identity: Identity, canonical_events: Sequence[Mapping[str, Any]]) -> str:
    """``sha256:`` digest of a prefix: domain, identity, then each event framed with its seq."""
    h = hashlib.sha256()
    h.update(_lp(PREFIX_DOMAIN))
    h.update(_lp(_stable(identity.to_json())))
    for seq, event in enumerate(canonical_events, start=1):
        h.update(seq.to_bytes(8, "big"))
        h.update(_lp(_stable(_hashed_form(dict(event)))))
    return "sha256:" + h.hexdigest()


def manifest_digest(segments: Sequence[Mapping[str, Any]]) -> str:
    """``sha256:`` digest of a cursor's segment list (the continuation boundary digest)."""
    body = {"protocol": CURSOR_PROTOCOL, "segments": [dict(s) for s in segments]}
    h = hashlib.sha256()
    h.update(_lp(MANIFEST_DOMAIN))
    h.update(_lp(_stable(body)))
    return "sha256:" + h.hexdigest()


def build_cursor(prefixes: Sequence[Prefix]) -> dict[str, Any]:
    """The boundary cursor over segments, oldest first.

    Raises:
        PrefixUnreadable: code ``boundary_cursor_invalid`` when the segments span sessions or
            repeat a run, invocation or turn id.
    """
    if not prefixes:
        raise PrefixUnreadable("boundary_cursor_invalid", "a cursor needs at least one segment")
    ids = [p.identity for p in prefixes]
    if (
        len({i.session_id for i in ids}) != 1
        or len({i.run_id for i in ids}) != len(ids)
        or len({i.invocation_id for i in ids}) != len(ids)
        or len({i.turn_id for i in ids}) != len(ids)
    ):
        raise PrefixUnreadable("boundary_cursor_invalid", "segments must share a session and not repeat ids")
    segments = [p.segment() for p in prefixes]
    return {"protocol": CURSOR_PROTOCOL, "segments": segments, "manifestDigest": manifest_digest(segments)}


def provider_replay_digest(items: Sequence[Mapping[str, Any]]) -> str:
    """``sha256:`` digest of the provider items a continuation replays (no domain framing)."""
    body = {"protocol": REPLAY_PROTOCOL, "providerProjectionVersion": PROVIDER_PROJECTION_VERSION}
    body["items"] = [dict(i) for i in items]
    return "sha256:" + hashlib.sha256(_stable(body)).hexdigest()


def read_prefix(raw: Any, up_to_event_seq: Any = None) -> Prefix:
    """Read a run's immutable prefix from its ledger (a list of RuntimeEvent JSON objects).

    Args:
        raw: the run's events in event-sequence order (event_seq = index + 1), as RuntimeEvent
            JSON objects or already-decoded RuntimeEvents.
        up_to_event_seq: the high-water to cut at; ``None`` reads the whole ledger.

    Raises:
        PrefixUnreadable: the list is missing or empty, the high-water is not a positive safe
            integer or lies beyond the ledger, or an event is undecodable, partial or carries
            another identity than the first event.
    """
    if not isinstance(raw, list) or not raw:
        raise PrefixUnreadable("runtime_prefix_missing", "the ledger is missing or empty")
    items: list[Any] = raw
    if up_to_event_seq is not None:
        if (
            isinstance(up_to_event_seq, bool)
            or not isinstance(up_to_event_seq, int | float)
            or not 0 < up_to_event_seq <= _MAX_SAFE  # first: an infinity has no int()
            or up_to_event_seq != int(up_to_event_seq)
        ):
            raise PrefixUnreadable(
                "runtime_prefix_high_water_invalid", "high-water is not a positive integer"
            )
        if int(up_to_event_seq) > len(raw):
            raise PrefixUnreadable("runtime_prefix_high_water_invalid", "high-water lies beyond the ledger")
        items = raw[: int(up_to_event_seq)]
    events: list[RuntimeEvent] = []
    for index, item in enumerate(items):
        try:
            if isinstance(item, RuntimeEvent):
                events.append(item)
            else:
                event = from_json_object(item)
                # The reference keeps only an event its canonical JSON gives back unchanged
                # (encodeCanonicalRuntimeEvent): a -0 its decoder let through (a ``ts``) is not.
                canonical_json.check(event.to_wire())
                events.append(event)
        except CodecError as exc:
            raise PrefixUnreadable(
                "runtime_prefix_undecodable", f"event {index + 1}: {exc.message}"
            ) from None
    first = events[0]
    identity = Identity(first.session_id, first.invocation_id, first.run_id, first.turn_id)
    for event in events:
        if event.partial:
            raise PrefixUnreadable("runtime_prefix_partial", f"event {event.id} is partial")
        if (event.session_id, event.invocation_id, event.run_id, event.turn_id) != (
            identity.session_id,
            identity.invocation_id,
            identity.run_id,
            identity.turn_id,
        ):
            raise PrefixUnreadable("runtime_prefix_mixed", f"event {event.id} belongs to another execution")
    canonical = tuple(canonical_event(e) for e in events)
    return Prefix(identity, tuple(events), canonical, prefix_digest(identity, canonical))
