"""Run your workflow; print how its maka session ended."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path

from maka_temporal import SessionResult, connect
from workflows import ReleaseNotes

HERE = Path(__file__).parent


async def main(workspace: str) -> None:
    client = await connect()
    result = await client.execute_workflow(
        ReleaseNotes.run,
        args=[str(Path(workspace).resolve()), str(HERE / "script.json")],
        id=f"release-notes-{uuid.uuid4().hex[:8]}",
        task_queue=os.environ.get("MAKA_TASK_QUEUE", "maka-examples"),
        result_type=SessionResult,
    )
    # A parked child carries no text: its reason says what an operator must do.
    said = result.text if result.outcome != "parked" else f"parked ({result.park_reason})"
    print(f"session {result.session_id}: {result.state}: {said}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
    # Leave without interpreter finalization: the Temporal SDK's core threads may still call into
    # Python for a moment, which can abort a finished process (temporalio/sdk-python issue 300).
    sys.stdout.flush()
    os._exit(0)
