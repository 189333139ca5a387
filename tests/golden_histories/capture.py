"""Regenerate the golden histories from a real dev server: ``python tests/golden_histories/capture.py
[NAME ...]`` (only the named scenarios; all of them without a name).

Each scenario runs the real session workflow and worker (the last one kills a real worker process at
a failpoint, so the recovery path is in a history too) and writes the workflow's history as JSON.
``tests/test_replay.py`` replays them with ``temporalio.worker.Replayer`` in CI: a workflow change
that is not replay-compatible (without ``workflow.patched``) fails a test, not a production worker.
Regenerate only for a deliberate, versioned change, and keep the old files that still matter. The
scenarios from before the ``with_tool`` model step mode pin ``model_step_mode="local"``, the mode
they were recorded in; the ``with_tool_*`` ones record the default since.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from temporalio.client import WorkflowHistory  # noqa: E402

from maka_temporal.workers.client.connect import connect  # noqa: E402
from maka_temporal.workers.client.session_api import SessionClient  # noqa: E402
from maka_temporal.workers.host import devserver  # noqa: E402
from maka_temporal.workflows.contracts import workflow_id_for  # noqa: E402
from tests.temporal_support import (  # noqa: E402
    WorkerProcess,
    in_process_worker,
    query_status,
    send_message,
    start,
    tool_step,
    wait_turn,
    write_script,
)
from tests.test_replay import local_step_split  # noqa: E402


async def _save(client: Any, session_id: str, name: str, *, all_runs: bool = False) -> list[Path]:
    handle = client.get_workflow_handle(workflow_id_for(session_id))
    written = []
    if all_runs:
        desc = await handle.describe()
        run_id: str | None = desc.raw_description.workflow_execution_info.first_run_id
        index = 0
        while run_id:
            history = await client.get_workflow_handle(
                workflow_id_for(session_id), run_id=run_id
            ).fetch_history()
            path = HERE / f"{name}-{index}.json"
            path.write_text(history.to_json())
            written.append(path)
            nxt = None
            for event in history.events:
                attrs = event.workflow_execution_continued_as_new_event_attributes
                if event.HasField("workflow_execution_continued_as_new_event_attributes"):
                    nxt = attrs.new_execution_run_id
            run_id, index = nxt, index + 1
        return written
    history = await handle.fetch_history()
    path = HERE / f"{name}.json"
    path.write_text(history.to_json())
    return [path]


async def main(wanted: set[str]) -> None:
    def want(name: str) -> bool:
        return not wanted or name in wanted

    server = devserver.start(ui=False)
    tmp = Path(tempfile.mkdtemp(prefix="maka-golden-"))
    try:
        client = await connect(server.address)
        db = tmp / "ledger.sqlite"
        ws = tmp / "ws"
        ws.mkdir()
        queue = "golden"
        every_tool = write_script(
            tmp / "every.json",
            [
                tool_step(("write_file", {"path": "a.txt", "content": "alpha\n"}), text="writing"),
                tool_step(("read_file", {"path": "a.txt"}), ("list_dir", {"path": "."})),
                tool_step(("edit_file", {"path": "a.txt", "old_text": "alpha", "new_text": "beta"})),
                tool_step(("bash", {"command": "cat a.txt"})),
                tool_step(("read_file", {"path": "../outside.txt"})),  # refused before T1
                {"text": "first turn done"},
                {"text": "second turn: nothing to do"},
            ],
        )
        written: list[Path] = []
        async with in_process_worker(client, db, queue):
            for name, mode in (
                ("two_turns_every_tool", "local"),
                ("with_tool_two_turns_every_tool", "with_tool"),
            ):
                if not want(name):
                    continue
                sid, first = await start(client, ws, every_tool, queue, "do it", model_step_mode=mode)
                await wait_turn(client, sid, first.run_id)
                second = await send_message(client, sid, "anything else?")
                await wait_turn(client, sid, second.run_id)
                written += await _save(client, sid, name)

            can_script = write_script(tmp / "can.json", [{"text": f"turn {i}"} for i in range(3)])
            if want("continue_as_new"):
                sid, acc = await start(
                    client, ws, can_script, queue, "t0", continue_as_new_after=1, model_step_mode="local"
                )
                await wait_turn(client, sid, acc.run_id)
                for i in (1, 2):
                    while True:
                        try:
                            acc = await send_message(client, sid, f"t{i}")
                            break
                        except Exception:
                            await asyncio.sleep(0.05)
                    await wait_turn(client, sid, acc.run_id)
                written += await _save(client, sid, "continue_as_new", all_runs=True)

            long_turn = write_script(
                tmp / "long.json",
                [tool_step(("list_dir", {"path": "."})) for _ in range(3)] + [{"text": "long turn done"}],
            )
            for name, mode in (
                ("mid_turn_continue_as_new", "local"),
                ("with_tool_mid_turn_continue_as_new", "with_tool"),
            ):
                if not want(name):
                    continue
                # with_tool: each step rode with the call before it, so every new execution starts
                # with a local step that finds the carried step committed (``replayed``).
                sid, acc = await start(
                    client, ws, long_turn, queue, "go", continue_as_new_after_steps=1, model_step_mode=mode
                )
                await wait_turn(client, sid, acc.run_id)
                written += await _save(client, sid, name, all_runs=True)

            if want("local_step_split"):
                # ``maka-step-patches-1``: an execution continued mid-turn takes its first (local)
                # step's result in a later workflow task than the one that recorded the step's
                # marker, then runs the step's two calls side by side. Timing makes the split
                # (something arriving meanwhile), so the scenario runs until its run 1 shows it.
                split = write_script(
                    tmp / "split.json",
                    [
                        tool_step(
                            ("write_file", {"path": "a.txt", "content": "x\n"}),
                            ("write_file", {"path": "b.txt", "content": "y"}),
                        ),
                        tool_step(("read_file", {"path": "b.txt"}), ("no_such_tool", {"any": "thing"})),
                        {"text": "split done"},
                    ],
                )
                for attempt in range(20):
                    (split_ws := tmp / f"split-{attempt}").mkdir()
                    sid, acc = await start(
                        client, split_ws, split, queue, "go", continue_as_new_after_steps=1
                    )
                    await wait_turn(client, sid, acc.run_id)
                    runs = await _save(client, sid, "local_step_split", all_runs=True)
                    if local_step_split(WorkflowHistory.from_json("split", runs[1].read_text())):
                        written += runs
                        break
                else:
                    raise SystemExit("20 sessions and no run took its local step in a later task")

            if want("hybrid_two_turns_every_tool"):
                # ``tool_mode="hybrid"`` (``maka-local-tools-1``): the file tools' first dispatch is
                # a local activity (a marker), bash a regular activity, the refused read a marker.
                sid, first = await start(client, ws, every_tool, queue, "do it", tool_mode="hybrid")
                await wait_turn(client, sid, first.run_id)
                second = await send_message(client, sid, "anything else?")
                await wait_turn(client, sid, second.run_id)
                written += await _save(client, sid, "hybrid_two_turns_every_tool")

            # ``maka-parallel-tools-1``: one step of reads, a write, a lone bash and a refused read,
            # side by side (``workflows.fanout``), in activity and in hybrid mode.
            fan = write_script(
                tmp / "fan.json",
                [
                    tool_step(
                        ("read_file", {"path": "a.txt"}),
                        ("write_file", {"path": "fan.txt", "content": "fan\n"}),
                        ("list_dir", {"path": "."}),
                        ("bash", {"command": "echo lone"}),
                        ("read_file", {"path": "../outside.txt"}),
                        ("read_file", {"path": "a.txt"}),
                    ),
                    {"text": "fanned out"},
                ],
            )
            for name, mode in (("parallel_calls", "activity"), ("hybrid_parallel_calls", "hybrid")):
                if want(name):
                    sid, acc = await start(
                        client, ws, fan, queue, "fan out", tool_mode=mode, max_parallel_tools=8
                    )
                    await wait_turn(client, sid, acc.run_id)
                    written += await _save(client, sid, name)

            model_activity = write_script(
                tmp / "ma.json", [tool_step(("list_dir", {"path": "."})), {"text": "ok"}]
            )
            if want("model_step_as_activity"):
                sid, acc = await start(client, ws, model_activity, queue, "go", model_step_mode="activity")
                await wait_turn(client, sid, acc.run_id)
                written += await _save(client, sid, "model_step_as_activity")

        if want("approval_and_cancel"):
            # Since ``maka-turn-messages-1``: a write waits for its approval in the workflow (a
            # timer at expiresAt) and is approved by the ``approve`` Update; the next turn's bash
            # is cancelled by ``cancel_turn`` (its T2 ``tool_cancelled``, the run ``cancelled``).
            from maka_core.runtime.runtime import RuntimeSettings
            from maka_core.settings import MakaSettings
            from maka_temporal.workers.client import turn_messages
            from maka_temporal.workers.client.policy import session_policy

            policy = tmp / "confirm.json"
            policy.write_text(
                '{"mutations": "confirm", "approvalTtlMs": 600000,'
                ' "defaultEvidence": {"bash": [{"type": "exit_code", "value": 0}]}}'
            )
            governed = session_policy(MakaSettings(db=str(db)), None, policy, "human:golden", ())
            governed.record_in(MakaSettings(db=str(db)))
            script = write_script(
                tmp / "approve.json",
                [
                    tool_step(("write_file", {"path": "g.txt", "content": "golden\n"})),
                    {"text": "written"},
                    tool_step(("bash", {"command": "sleep 600"})),
                    {"text": "never"},
                ],
            )
            quick = RuntimeSettings(tool_heartbeat_timeout_s=1.0)
            async with in_process_worker(client, db, queue + "-messages", settings=quick):
                sid, acc = await start(
                    client, ws, script, queue + "-messages", "write", session_id=governed.session_id
                )
                for message in ("write", "sleep"):
                    if message == "sleep":
                        acc = await send_message(client, sid, message)
                    while (status := await query_status(client, sid)).awaiting_approval is None:
                        await asyncio.sleep(0.1)
                    wait = status.awaiting_approval
                    await turn_messages.approve(
                        client, sid, wait.approval_id, phrase=wait.phrase, by="golden"
                    )
                    if message == "write":
                        await wait_turn(client, sid, acc.run_id)
                await asyncio.sleep(2)  # the approved bash is running
                await turn_messages.cancel_turn(client, sid, reason="golden")
                written += await _save(client, sid, "approval_and_cancel")

        park_script = write_script(
            tmp / "park.json", [tool_step(("bash", {"command": "echo x >> log.txt"})), {"text": "ok"}]
        )
        for name, mode in (("crash_recover_park", "local"), ("with_tool_crash_recover_park", "with_tool")):
            if not want(name):
                continue
            with WorkerProcess(server, db, queue, home=tmp, failpoint="P4", failpoint_tag="bash") as doomed:
                doomed.wait_ready()
                sid, acc = await start(client, ws, park_script, queue, "go", model_step_mode=mode)
                await doomed.wait_exit()
            with WorkerProcess(server, db, queue, home=tmp) as worker:
                worker.wait_ready()
                await wait_turn(client, sid, acc.run_id)
                written += await _save(client, sid, name)
        if want("wake_resolve_continue"):
            # The bash parks (P4), an operator resolves it through ``SessionClient.resolve``, whose
            # wake Signal makes the same execution claim and run the continuation's turn
            # (``maka-session-wake-1``: the signal, ``maka.session_continue``, the continuation).
            with WorkerProcess(server, db, queue, home=tmp, failpoint="P4", failpoint_tag="bash") as doomed:
                doomed.wait_ready()
                sid, acc = await start(client, ws, park_script, queue, "go")
                await doomed.wait_exit()
            with WorkerProcess(server, db, queue, home=tmp) as worker:
                worker.wait_ready()
                parked = await wait_turn(client, sid, acc.run_id)
                sessions = SessionClient(client, ledger=db)
                await sessions.resolve(
                    sid, parked.parked_operation_id, decision="applied", by="golden", reason="log.txt has it"
                )
                while (await query_status(client, sid)).state != "idle":
                    await asyncio.sleep(0.1)
                written += await _save(client, sid, "wake_resolve_continue")
        if want("hybrid_crash_recover"):
            # A worker killed after a local write_file's effect, before its T2: the task's markers
            # are lost, the replay's re-run meets T1 (a failure marker), recovery finalizes it.
            crash_script = write_script(
                tmp / "hybrid-crash.json",
                [tool_step(("write_file", {"path": "h.txt", "content": "hybrid\n"})), {"text": "ok"}],
            )
            armed = {"failpoint": "P4", "failpoint_tag": "write_file"}
            with WorkerProcess(server, db, queue, home=tmp, **armed) as doomed:
                doomed.wait_ready()
                sid, acc = await start(client, ws, crash_script, queue, "go", tool_mode="hybrid")
                await doomed.wait_exit()
            with WorkerProcess(server, db, queue, home=tmp) as worker:
                worker.wait_ready()
                await wait_turn(client, sid, acc.run_id)
                written += await _save(client, sid, "hybrid_crash_recover")
        for path in written:
            print(f"wrote {path.relative_to(HERE.parents[1])} ({path.stat().st_size} bytes)")
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main(set(sys.argv[1:])))
