"""A vendor that accepts a model request and never answers, on 127.0.0.1: it speaks both wire
formats (OpenAI ``POST /v1/chat/completions``, Anthropic ``POST /v1/messages``), reads the whole
request, logs its arrival time (``time.time()``, wall clock, so a test compares it with a signal it
sent to another process) and holds the connection open until ``close``.

Which requests it holds is the test's (``hold``: their 1-based numbers); every other request is
answered in its wire's shape: with a ``write_file`` call when ``tool_first`` and it is the first,
else with a final text (``ANSWER``), so a session a test stopped can finish on the next worker.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANSWER = "answered after the stop"
NOTE = {"path": "notes.txt", "content": "before the stop\n"}


@dataclass(frozen=True)
class Held:
    at: float  # time.time() on arrival
    path: str
    body: dict[str, Any]


def _answer(anthropic: bool, call: bool) -> dict[str, Any]:
    if anthropic:
        block = (
            {"type": "tool_use", "id": "toolu_note", "name": "write_file", "input": NOTE}
            if call
            else {"type": "text", "text": ANSWER}
        )
        return {
            "id": "msg_held",
            "type": "message",
            "role": "assistant",
            "model": "claude-held",
            "content": [block],
            "stop_reason": "tool_use" if call else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 3},
        }
    message: dict[str, Any] = {"role": "assistant", "content": ANSWER}
    if call:
        function = {"name": "write_file", "arguments": json.dumps(NOTE)}
        message = {"role": "assistant", "content": None,
                   "tool_calls": [{"id": "call_note", "type": "function", "function": function}]}  # fmt: skip
    return {
        "id": "chatcmpl-held",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-held",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if call else "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
    }


class HeldVendor:
    def __init__(self, hold: Collection[int] = (1,), *, tool_first: bool = False) -> None:
        self.hold = frozenset(hold)
        self.tool_first = tool_first
        self.requests: list[Held] = []
        self._closing = threading.Event()
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.requests.append(Held(time.time(), self.path, body))
                    number = len(server.requests)
                if number in server.hold:
                    server._closing.wait()  # never answer; the client may hang up meanwhile
                    return
                call = server.tool_first and number == 1
                data = json.dumps(_answer(self.path.endswith("/messages"), call)).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def arrivals(self) -> list[float]:
        with self._lock:
            return [r.at for r in self.requests]

    def close(self) -> None:
        self._closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()
