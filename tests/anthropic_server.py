"""A local HTTP server that speaks Anthropic's Messages wire format (``POST /v1/messages``), on
127.0.0.1 only: it answers from a queue of replies (messages with text and ``tool_use`` blocks and
usage, or errors with their headers) and records every request with its arrival time."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.sse_replies import Pace, message_events, send_sse, streamed


@dataclass
class Reply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Request:
    at: float  # time.monotonic() on arrival
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def message(
    *blocks: dict[str, Any],
    stop: str = "end_turn",
    usage: dict[str, int] | None = None,
) -> Reply:
    return Reply(
        200,
        {
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": list(blocks),
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage or {"input_tokens": 21, "output_tokens": 5},
        },
    )


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(id_: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": id_, "name": name, "input": args}


def error(status: int, kind: str, msg: str, **headers: str) -> Reply:
    return Reply(status, {"type": "error", "error": {"type": kind, "message": msg}}, dict(headers))


class MessagesServer:
    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.replies: list[Reply] = []
        self._lock = threading.Lock()
        #: How a streamed answer is paced (``tests.sse_replies``); ``sse`` False: answer a request
        #: that asks to stream whole, as a gateway that ignores ``stream`` does.
        self.pace = Pace()
        self.sse = True
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.requests.append(
                        Request(
                            time.monotonic(), self.path, {k.lower(): v for k, v in self.headers.items()}, body
                        )
                    )
                    reply = (
                        server.replies.pop(0)
                        if server.replies
                        else error(500, "api_error", "no reply queued")
                    )
                frames = streamed(body, reply.status, reply.body, message_events)
                if frames is not None and server.sse:
                    send_sse(self, frames, server.pace)
                    return
                data = json.dumps(reply.body).encode()
                try:
                    if any(k.lower() == "date" for k in reply.headers):
                        self.send_response_only(reply.status)  # the reply's own Date, not the clock's
                    else:
                        self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def reply(self, *replies: Reply) -> None:
        with self._lock:
            self.replies.extend(replies)

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.replies.clear()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextmanager
def messages_server() -> Iterator[MessagesServer]:
    server = MessagesServer()
    try:
        yield server
    finally:
        server.close()
