"""Start a session that calls ``word_count``, wait for its turn, print what happened."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from maka_temporal import SessionClient, connect

HERE = Path(__file__).parent


async def main(workspace: str) -> None:
    sessions = SessionClient(await connect(), task_queue=os.environ.get("MAKA_TASK_QUEUE", "maka-examples"))
    # A scripted model (script.json) stands in for a real one: --model openai:NAME works the same.
    script = HERE / "script.json"
    started = await sessions.start(workspace=workspace, message="How many words?", script=script)
    status = await sessions.wait(started.session_id, started.run_id)
    print(f"session {status.session_id}: {status.state}")
    for op in status.operations:
        print(f"  {op.tool_name}: {op.status}" + (" (error)" if op.is_error else ""))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
    # Leave without interpreter finalization: the Temporal SDK's core threads may still call into
    # Python for a moment, which can abort a finished process (temporalio/sdk-python issue 300).
    sys.stdout.flush()
    os._exit(0)
