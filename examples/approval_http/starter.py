"""Start a session whose policy asks for approval of every change; answer it through the HTTP
handler, as a reviewer's tool would; wait for the turn."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.request
from pathlib import Path

from maka_temporal import SessionClient, connect

HERE = Path(__file__).parent


async def main(workspace: str, handler: str) -> None:
    sessions = SessionClient(await connect(), task_queue=os.environ.get("MAKA_TASK_QUEUE", "maka-examples"))
    started = await sessions.start(
        workspace=workspace,
        message="Tag the release.",
        script=HERE / "script.json",
        policy=HERE / "policy.json",
    )
    status = await sessions.status(started.session_id)
    while not status.pending_approvals:  # the write waits for a reviewer
        await asyncio.sleep(0.2)
        status = await sessions.status(started.session_id)
    pending = status.pending_approvals[0]
    print(f"session {started.session_id}: {status.state}: {pending['toolName']} ({pending['phrase']})")
    body = {"sessionId": started.session_id, "approvalId": pending["approvalId"], "phrase": pending["phrase"]}
    answer = json.dumps({**body, "by": "human:alice"}).encode()
    request = urllib.request.Request(f"{handler}/approve", data=answer)
    with urllib.request.urlopen(request) as reply:
        print(f"handler: {json.loads(reply.read())['decision']}")
    status = await sessions.wait(started.session_id, started.run_id)
    print(f"session {status.session_id}: {status.state}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
    # Leave without interpreter finalization: the Temporal SDK's core threads may still call into
    # Python for a moment, which can abort a finished process (temporalio/sdk-python issue 300).
    sys.stdout.flush()
    os._exit(0)
