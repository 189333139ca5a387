"""A local model server with a small context window, speaking both vendors' wire formats on
127.0.0.1: OpenAI chat completions (``POST /v1/chat/completions``) and Anthropic Messages
(``POST /v1/messages``). Unlike the queue servers (``tests/anthropic_server.py``,
``tests/test_providers.ChatServer``) it answers from the request, so a session of any length runs:

- a request past ``window`` tokens (its own count: the request's messages as JSON, 4 bytes a
  token, as real tokenizers average) gets each vendor's 400 for it (OpenAI ``context_length_exceeded``,
  Anthropic ``prompt is too long``);
- a request with no tools whose last user text holds ``<conversation>`` is a compaction: it gets a
  summary numbered by how many summaries the server has written (a regenerated summary differs);
- otherwise a user text ``turn N`` gets a ``write_file`` call (``notes/N.txt``, a padded body), and
  the result of that call a final text: one tool call per turn, so the history grows with pairs.

Every request is recorded (``requests``: path and body) in arrival order.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PAD = "lorem ipsum dolor sit amet " * 8


@dataclass
class Seen:
    path: str
    body: dict[str, Any]


def _usage(tokens: int, anthropic: bool) -> dict[str, int]:
    if anthropic:
        return {"input_tokens": tokens, "output_tokens": 12}
    return {"prompt_tokens": tokens, "completion_tokens": 12, "total_tokens": tokens + 12}


class WindowedVendor:
    def __init__(self, window: int, delay: float = 0.0) -> None:
        self.window = window
        #: Seconds each answer takes (a turn that runs long enough to be watched).
        self.delay = delay
        #: Cleared, the vendor holds every answer until a test sets it (bounded at 120 s).
        self.release = threading.Event()
        self.release.set()
        self.requests: list[Seen] = []
        self.summaries = 0
        self.overflows = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.requests.append(Seen(self.path, body))
                    status, reply = server.answer(self.path.endswith("/messages"), body)
                time.sleep(server.delay)
                server.release.wait(120)
                data = json.dumps(reply).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
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

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def tokens(self, body: dict[str, Any]) -> int:
        """The server's own count of a request's prompt (not maka's estimate)."""
        sent = {k: body.get(k) for k in ("system", "messages", "tools")}
        return len(json.dumps(sent).encode()) // 4

    # -- answers ----------------------------------------------------------------------------------

    def answer(self, anthropic: bool, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        tokens = self.tokens(body)
        if tokens > self.window:
            self.overflows += 1
            if anthropic:
                message = f"prompt is too long: {tokens} tokens > {self.window} maximum"
                return 400, {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
            message = (
                f"This model's maximum context length is {self.window} tokens. However, your messages "
                f"resulted in {tokens} tokens. Please reduce the length of the messages."
            )
            return 400, {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": "messages",
                    "code": "context_length_exceeded",
                }
            }
        last_text, last_result = self._last(anthropic, body)
        if not body.get("tools") and last_text is not None and "<conversation>" in last_text:
            self.summaries += 1
            turns = re.findall(r"user: turn (\d+)", last_text)
            span = f"turns {turns[0]}..{turns[-1]}" if turns else "no new turns"
            return 200, self._text(anthropic, f"summary #{self.summaries}: {span} wrote notes", tokens)
        if last_result is not None:
            return 200, self._text(anthropic, f"wrote it. {PAD}", tokens)
        match = re.search(r"turn (\d+)", last_text or "")
        n = match.group(1) if match else "x"
        args = {"path": f"notes/{n}.txt", "content": f"note {n}: {PAD}"}
        return 200, self._call(anthropic, f"call_{n}", args, tokens)

    def _last(self, anthropic: bool, body: dict[str, Any]) -> tuple[str | None, Any]:
        """The last message's user text, or its tool result."""
        message = body["messages"][-1]
        if anthropic:
            blocks = message["content"] if isinstance(message["content"], list) else []
            results = [b for b in blocks if b.get("type") == "tool_result"]
            texts = [b["text"] for b in blocks if b.get("type") == "text"]
            if results:
                return None, results[-1]
            return (texts[-1] if texts else None), None
        if message["role"] == "tool":
            return None, message["content"]
        return (message.get("content") if message["role"] == "user" else None), None

    def _text(self, anthropic: bool, text: str, tokens: int) -> dict[str, Any]:
        if anthropic:
            return {
                "id": "msg_w",
                "type": "message",
                "role": "assistant",
                "model": "claude-window",
                "content": [{"type": "text", "text": text}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": _usage(tokens, True),
            }
        return {
            "id": "chatcmpl-w",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-window",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": _usage(tokens, False),
        }

    def _call(self, anthropic: bool, call_id: str, args: dict[str, Any], tokens: int) -> dict[str, Any]:
        if anthropic:
            return {
                "id": "msg_w",
                "type": "message",
                "role": "assistant",
                "model": "claude-window",
                "content": [{"type": "tool_use", "id": call_id, "name": "write_file", "input": args}],
                "stop_reason": "tool_use",
                "stop_sequence": None,
                "usage": _usage(tokens, True),
            }
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": "write_file", "arguments": json.dumps(args)},
        }
        return {
            "id": "chatcmpl-w",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-window",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": _usage(tokens, False),
        }
