"""The soak's operator bot: moves every parked session on, as a careful operator would.

For a parked session it does what ``maka resume`` tells an operator to do: terminate the parked
execution, ``maka resume`` (which answers with the operations still pending), ``maka session
resolve`` each one with the truth of the effect log (``applied`` when its effect line exists, else
``not_applied``), and ``maka resume --wait`` again, until the session is idle or a round limit is
spent. Every command goes through the real CLI; every decision is appended to ``operator.jsonl``
(the checker holds each against the effect log as it is at the end).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from benchmarks import soak_check
from maka_core.runtime.session_view import operations
from maka_core.store.writer import LedgerStore
from maka_temporal.workflows.contracts import workflow_id_for
from tests.drills import settle

ROUNDS = 8
#: The soak's user tools, as its workers and the operator's commands are given them.
TOOLS_SPEC = "benchmarks.soak_tools:TOOLS"
#: The resume diagnostics that name an operation an operator must settle.
UNSETTLED = frozenset({"pending_tool_result", "tool_recovery_parked"})
OperatorMode = Literal["resolve", "resume-only", "none"]


class Operator:
    def __init__(
        self,
        client: Any,
        out: Path,
        ledger: str,
        address: str,
        queue: str,
        sessions: dict[str, str],
        *,
        mode: OperatorMode = "resolve",
        effects_env: dict[str, str] | None = None,
    ) -> None:
        """``mode="resume-only"``: the negative control of a resume that ignores the parked calls."""
        self.mode = mode
        #: Where effects go: ``maka resume`` runs recovery itself (a read-only or keyed call runs
        #: again in its process), so it writes effect lines like a worker.
        self.effects_env = effects_env or {}
        self.rng: random.Random | None = None
        self.record: Callable[..., None] | None = None
        self.kill_p = 0.0

        self.client, self.out, self.ledger, self.address, self.queue = client, out, ledger, address, queue
        self.sessions = sessions
        self.actions = 0

    def arm(self, rng: random.Random, record: Callable[..., None], kill_p: float) -> None:
        """SIGKILL this bot's ``maka resume`` mid-way with probability ``kill_p`` (drawn from ``rng``),
        recording each as a ``resume_kill`` fault."""
        self.rng, self.record, self.kill_p = rng, record, kill_p

    async def cli(self, *args: str, timeout: float = 300) -> tuple[int, dict[str, Any]]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "maka_temporal", *args, "--db", self.ledger, "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=soak_check.ROOT,
            env=_env(self.address, self.queue, self.effects_env),
        )  # fmt: skip
        if args[0] == "resume" and self.rng is not None and self.rng.random() < self.kill_p:
            after = self.rng.uniform(0.2, 3.0)
            try:
                await asyncio.wait_for(proc.wait(), after)
            except TimeoutError:
                proc.kill()  # SIGKILL of our own child, mid-resume
                await proc.wait()
                if self.record is not None:
                    self.record("resume_kill", None, f"after {after:.1f}s")
                return -9, {"error": "resume killed by the soak"}
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()  # our own child
            await proc.wait()
            return -1, {"error": f"maka {' '.join(args)} did not answer in {timeout:.0f}s"}
        parsed = soak_check.parse_json(out.decode(errors="replace"))
        if not isinstance(parsed, dict):
            text, problem = out.decode(errors="replace"), err.decode(errors="replace")
            parsed = {"raw": text[-500:], "stderr": problem[-500:]}
        return proc.returncode or 0, parsed

    def log(self, entry: dict[str, Any]) -> None:
        self.actions += 1
        entry["at"] = time.time()
        with open(self.out / "operator.jsonl", "a") as fh:
            fh.write(json.dumps(entry, default=str) + "\n")

    def truth(self, sid: str, op_id: str) -> tuple[str, list[str] | None]:
        """``applied`` when the operation's effect line exists, else ``not_applied``."""
        with LedgerStore.open(self.ledger) as store:
            events = store.events(session_id=sid)
        op = next((o for o in operations(events) if o.operation_id == op_id), None)
        if op is None:
            return "not_applied", None
        key = soak_check.call_key(op.tool_name, soak_check.op_args(events, op), self.sessions[sid])
        index = soak_check.effect_index(self.out, self.sessions)
        seen = len(index.get(key, [])) if key else 0
        return ("applied" if seen else "not_applied"), list(key) if key else None

    async def terminate(self, sid: str) -> None:
        try:
            handle = self.client.get_workflow_handle(workflow_id_for(sid))
            await handle.terminate(reason="soak operator: parked")
        except Exception as exc:  # already closed, or the server is busy: resume will say
            self.log({"session": sid, "action": "terminate", "error": repr(exc)[:200]})

    async def handle(self, sid: str, status: Any) -> Any:
        """Move a parked session on; return its status afterwards (parked again: rounds spent)."""
        self.log({"session": sid, "action": "parked", "reason": status.park_reason})
        await self.terminate(sid)
        for _ in range(ROUNDS if self.mode == "resolve" else 2):
            code, out = await self.cli("resume", sid, "--task-queue", self.queue, "--wait")
            self.log({"session": sid, "action": "resume", "exit": code, "decision": out.get("decision"),
                      "state": out.get("state"), "code": out.get("code"), "parkReason": out.get("parkReason"),
                      "diagnostics": [d.get("code") for d in out.get("diagnostics", [])],
                      **({"raw": out} if "raw" in out or "error" in out else {})})  # fmt: skip
            if code == 0 and out.get("state") == "idle":
                return await settle(self.client, sid, timeout=300, interval=0.25)
            pending = [
                d["detail"]["operationId"]
                for d in out.get("diagnostics", [])
                if d.get("code") in UNSETTLED and d.get("detail", {}).get("operationId")
            ]
            for op_id in pending if self.mode == "resolve" else []:
                decision, key = self.truth(sid, op_id)
                rc, answer = await self.cli(
                    "session", "resolve", sid, "--operation", op_id, "--decision", decision,
                    "--by", "soak-operator", "--reason", "the effect log says so",
                )  # fmt: skip
                self.log({"session": sid, "operationId": op_id, "decision": decision, "key": key,
                          "exit": rc, "code": answer.get("code")})  # fmt: skip
            if out.get("code") in ("resume_not_needed", "session_busy") and out.get("state") != "parked":
                # An execution carries the session again (a resume that was cut had started it):
                # never terminate a live one; wait for its turn.
                return await settle(self.client, sid, timeout=300, interval=0.25)
            if out.get("state") == "parked" and (out.get("code") == "session_busy" or code == 0):
                await self.terminate(sid)
            if not pending:
                await asyncio.sleep(1.0)
        return await settle(self.client, sid, timeout=300, interval=0.25)


def _env(address: str, queue: str, effects_env: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(effects_env)
    # The worker's tools: resume checks the session's tool catalog against the ones it is given.
    env.update({"TEMPORAL_ADDRESS": address, "MAKA_TASK_QUEUE": queue, "MAKA_TOOLS": TOOLS_SPEC})
    for key in ("MAKA_FAILPOINT", "MAKA_FAILPOINT_TAG", "MAKA_FAILPOINT_SKIP"):
        env.pop(key, None)
    return env
