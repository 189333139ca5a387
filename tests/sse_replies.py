"""The streamed form of a vendor's queued reply, for the local servers that speak each wire format
(``tests.test_providers.ChatServer``, ``tests.anthropic_server.MessagesServer``): a request with
``"stream": true`` gets the same answer as server-sent events, its text in pieces, paced by the
test (``Pace``: a pause between chunks, and a hold the test releases)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: How many pieces a reply's text is cut into.
PIECES = 4


def pieces(text: str, n: int = PIECES) -> list[str]:
    """``text`` in up to ``n`` non-empty pieces, in order (joined: ``text``)."""
    if not text:
        return []
    size = max(1, -(-len(text) // n))
    return [text[i : i + size] for i in range(0, len(text), size)]


@dataclass
class Pace:
    """How a streamed reply is paced: ``pause_s`` before every chunk after the first; with ``hold``,
    the stream stops after ``hold_after`` text pieces until the test sets it (``held`` is set when
    it stops there)."""

    pause_s: float = 0.0
    hold_after: int = 2
    hold: threading.Event | None = None
    held: threading.Event = field(default_factory=threading.Event)

    def before_text(self, sent: int) -> None:
        if self.hold is not None and sent == self.hold_after:
            self.held.set()
            assert self.hold.wait(60), "the test never released the held stream"


def send_sse(handler: Any, frames: list[tuple[str | None, dict[str, Any] | str, bool]], pace: Pace) -> None:
    """Write ``frames`` (event name, data, whether it carries a text piece) as an SSE response."""
    try:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.end_headers()
        texts = 0
        for i, (event, data, is_text) in enumerate(frames):
            if i and pace.pause_s:
                time.sleep(pace.pause_s)
            if is_text:
                pace.before_text(texts)
                texts += 1
            body = data if isinstance(data, str) else json.dumps(data)
            head = f"event: {event}\n" if event else ""
            handler.wfile.write(f"{head}data: {body}\n\n".encode())
            handler.wfile.flush()
    except (BrokenPipeError, ConnectionResetError):
        pass
    handler.close_connection = True


Frames = list[tuple[str | None, dict[str, Any] | str, bool]]


def chat_chunks(payload: dict[str, Any]) -> Frames:
    """A chat completion as ``chat.completion.chunk`` events (``stream_options.include_usage``: its
    usage in a last chunk without choices), then ``[DONE]``."""
    choice = payload["choices"][0]
    message, finish = choice["message"], choice.get("finish_reason")
    head = {k: payload[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return head | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

    frames: Frames = [(None, chunk({"role": "assistant", "content": ""}), False)]
    frames += [(None, chunk({"content": piece}), True) for piece in pieces(message.get("content") or "")]
    for i, call in enumerate(message.get("tool_calls") or ()):
        function = call["function"]
        opening = {"index": i, "id": call["id"], "type": "function",
                   "function": {"name": function["name"], "arguments": ""}}  # fmt: skip
        frames.append((None, chunk({"tool_calls": [opening]}), False))
        for part in pieces(function.get("arguments") or "", 2):
            frames.append(
                (None, chunk({"tool_calls": [{"index": i, "function": {"arguments": part}}]}), False)
            )
    frames.append((None, chunk({}, finish), False))
    if payload.get("usage") is not None:
        frames.append((None, head | {"choices": [], "usage": payload["usage"]}, False))
    frames.append((None, "[DONE]", False))
    return frames


def message_events(body: dict[str, Any]) -> Frames:
    """A Messages-API message as its stream of events (``message_start`` ... ``message_stop``)."""
    usage = dict(body.get("usage") or {})
    start = {k: body[k] for k in ("id", "type", "role", "model")} | {
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    frames: Frames = [("message_start", {"type": "message_start", "message": start}, False)]
    for i, block in enumerate(body.get("content") or ()):
        if block["type"] == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [({"type": "text_delta", "text": p}, True) for p in pieces(block["text"])]
        else:
            opening = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            raw = json.dumps(block["input"])
            deltas = [({"type": "input_json_delta", "partial_json": p}, False) for p in pieces(raw, 2)]
        started = {"type": "content_block_start", "index": i, "content_block": opening}
        frames.append(("content_block_start", started, False))
        for delta, is_text in deltas:
            piece = {"type": "content_block_delta", "index": i, "delta": delta}
            frames.append(("content_block_delta", piece, is_text))
        frames.append(("content_block_stop", {"type": "content_block_stop", "index": i}, False))
    delta = {"stop_reason": body.get("stop_reason"), "stop_sequence": body.get("stop_sequence")}
    frames.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}, False))
    frames.append(("message_stop", {"type": "message_stop"}, False))
    return frames


def streamed(
    body: dict[str, Any], status: int, payload: Any, as_frames: Callable[[Any], Frames]
) -> Frames | None:
    """The frames to stream for a request, or ``None``: it did not ask to stream, or the reply is
    an error (a vendor refuses a streamed request with the same status and body)."""
    if not body.get("stream") or status != 200:
        return None
    return as_frames(payload)
