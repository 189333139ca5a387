"""A small HTTP handler that answers approvals: ``POST /approve`` with
``{"sessionId", "approvalId", "phrase", "by"}`` (or ``POST /deny`` with ``{"sessionId",
"approvalId", "by", "reason"}``). Stateless: every answer goes through ``SessionClient``, which sends
the session's ``approve``/``deny`` Update (the decision is a ledger fact first, then the waiting turn
wakes). A refusal answers 409 with its code."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from maka_temporal import ApprovalAnswer, SessionClient, SessionError, connect

TASK_QUEUE = os.environ.get("MAKA_TASK_QUEUE", "maka-examples")


async def answer(path: str, body: dict[str, str]) -> ApprovalAnswer | None:
    # One connection per request keeps the handler stateless (a real service would keep one).
    sessions = SessionClient(await connect(), task_queue=TASK_QUEUE)
    if path == "/approve":
        return await sessions.approve(
            body["sessionId"], body["approvalId"], phrase=body["phrase"], by=body.get("by")
        )
    if path == "/deny":
        return await sessions.deny(
            body["sessionId"], body["approvalId"], by=body.get("by"), reason=body.get("reason")
        )
    return None


class Approvals(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        try:
            done = asyncio.run(answer(self.path, body))
        except SessionError as exc:
            self._reply(409, exc.to_json())
            return
        if done is None:
            self._reply(404, {"code": "not_found"})
            return
        self._reply(200, {"ok": True, "decision": done.decision, "operationId": done.operation_id})

    def _reply(self, code: int, obj: dict[str, object]) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ.get("APPROVAL_PORT", "8088"))
    server = ThreadingHTTPServer(("127.0.0.1", port), Approvals)
    print(f"handler: listening on {server.server_address[1]}", flush=True)
    server.serve_forever()
