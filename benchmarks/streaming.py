"""Streamed steps (issue 31 item 4): time to the first partial token against time to the committed
step, on a stand-in vendor that writes its answer token by token.

Run: ``.venv/bin/python benchmarks/streaming.py [--tokens 40] [--token-ms 25] [--rounds 5]``.

The server is the one ``maka dev`` starts (``bench_server``); the worker is ``maka worker``'s
``serve`` in this process, its ledger a SQLite file. The vendor (127.0.0.1) speaks chat completions:
asked to stream, it sends ``--tokens`` text chunks ``--token-ms`` apart as server-sent events (then
its usage); asked whole, it waits as long and answers at once. Each round starts one streamed and
one ``--no-stream`` session of a one-step answer; a reader polls the ledger every 5 ms, as
``session show --follow`` does (less often), for the step's partial row and for its committed
events. Figures, from the client's start of the session (medians of ``--rounds``): the first partial
text seen, the committed step seen; and the worker's own time to first token (the row's
``firstTokenMs``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/<file>.py` from a checkout
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_server import bench_server, serving  # noqa: E402
from maka_core.store.writer import LedgerStore  # noqa: E402
from maka_temporal.workers.client.connect import connect  # noqa: E402
from maka_temporal.workers.client.session_client import start_session, wait_settled  # noqa: E402


@contextmanager
def stand_in_vendor(tokens: int, token_s: float) -> Iterator[str]:
    """A chat-completions vendor whose answer takes ``tokens * token_s``, streamed or whole."""
    words = [f"w{i} " for i in range(tokens)]
    head = {"id": "chatcmpl-bench", "created": 1, "model": "bench"}
    usage = {"prompt_tokens": 10, "completion_tokens": tokens, "total_tokens": 10 + tokens}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if not body.get("stream"):
                time.sleep(tokens * token_s)
                message = {"role": "assistant", "content": "".join(words)}
                whole = head | {
                    "object": "chat.completion",
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": usage,
                }
                data = json.dumps(whole).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            chunk = head | {"object": "chat.completion.chunk"}

            def send(data: Any) -> None:
                self.wfile.write(f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode())
                self.wfile.flush()

            for word in words:
                time.sleep(token_s)
                send(chunk | {"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]})
            send(chunk | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            send(chunk | {"choices": [], "usage": usage})
            send("[DONE]")
            self.close_connection = True

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()


def watch(db: Path, session_id: str, began: float, done: threading.Event) -> dict[str, float | None]:
    """Poll the ledger for the session's first partial text and its committed model step."""
    seen: dict[str, float | None] = {"partial": None, "committed": None, "firstTokenMs": None}
    store = LedgerStore.open(f"sqlite:///{db}")
    try:
        while not done.is_set() and seen["committed"] is None:
            if seen["partial"] is None:
                rows = [r for r in store.partials(session_id) if r["text"]]
                if rows:
                    seen["partial"] = time.perf_counter() - began
                    seen["firstTokenMs"] = rows[0]["firstTokenAt"] - rows[0]["startedAt"]
            if any(e.role == "model" for e in store.events(session_id=session_id)):
                seen["committed"] = time.perf_counter() - began
            time.sleep(0.005)
    finally:
        store.close()
    return seen


async def one_turn(client: Any, queue: str, tmp: Path, db: Path, stream: bool) -> dict[str, float | None]:
    ws = tmp / f"ws-{uuid.uuid4().hex[:8]}"
    ws.mkdir()
    session_id = f"sess-bench-{uuid.uuid4().hex[:12]}"
    done = threading.Event()
    began = time.perf_counter()
    watcher = asyncio.create_task(asyncio.to_thread(watch, db, session_id, began, done))
    try:
        _, accepted = await start_session(
            client,
            workspace=ws,
            provider={"kind": "openai", "model": "bench"},
            task_queue=queue,
            message="go",
            session_id=session_id,
            stream=stream,
        )
        status = await wait_settled(client, session_id, accepted.run_id, timeout=120)
    finally:
        done.set()
        seen = await watcher
    if status.state != "idle":
        raise SystemExit(f"session {session_id} ended {status.state} ({status.park_reason})")
    return seen


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="maka-stream-bench-"))
    queue, db = "maka-stream-bench", tmp / "ledger.sqlite"
    with stand_in_vendor(args.tokens, args.token_ms / 1000) as url, bench_server() as server:
        os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"] = url, "sk-bench"
        client = await connect(server.address)
        async with serving(client, db, queue):
            await one_turn(client, queue, tmp, db, True)  # warm-up
            runs: dict[bool, list[dict[str, float | None]]] = {True: [], False: []}
            for _ in range(args.rounds):
                for stream in (True, False):
                    runs[stream].append(await one_turn(client, queue, tmp, db, stream))
    answer_s = args.tokens * args.token_ms / 1000
    what = f"one step of {args.tokens} tokens {args.token_ms:g} ms apart ({answer_s:.2f} s)"
    print(f"{what}, median of {args.rounds}:")
    print(f"{'session':<12} {'first partial s':>16} {'committed s':>12} {'worker TTFT ms':>15}")
    for stream, label in ((True, "--stream"), (False, "--no-stream")):
        rows = runs[stream]
        first, committed = median([r["partial"] for r in rows]), median([r["committed"] for r in rows])
        ttft = median([r["firstTokenMs"] for r in rows])

        def fmt(v: float | None, spec: str) -> str:
            return format("-", ">" + spec.split(".")[0]) if v is None else format(v, spec)

        print(f"{label:<12} {fmt(first, '16.3f')} {fmt(committed, '12.3f')} {fmt(ttft, '15.0f')}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--token-ms", type=float, default=25.0)
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(parser.parse_args()))
