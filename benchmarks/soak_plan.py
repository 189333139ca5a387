"""The soak's seeded workload and fault draws: everything random the soak does comes from here.

One ``random.Random(seed)`` draws each session's script (turns of one to three tool steps mixing
the file tools, ``bash`` and the five ``soak_tools``), and a second one, seeded from the first, the
fault schedule (gap, kind, worker slot, failpoint). The same seed gives the same scripts and the
same sequence of fault draws; the moments the faults land in the work are real time, recorded in
the replay file as they happened.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

FaultKind = Literal["kill", "zombie", "failpoint", "server_restart"]
FAULT_KINDS: Final[tuple[FaultKind, ...]] = ("kill", "zombie", "failpoint", "server_restart")
#: ``server_restart`` is drawn rarely (each costs seconds of outage) and only done when the soak
#: started its own server.
FAULT_WEIGHTS: Final[tuple[float, ...]] = (0.42, 0.2, 0.33, 0.05)

USER_TOOLS: Final[tuple[str, ...]] = ("soak_read", "soak_idem", "soak_alo", "soak_recon", "soak_once")
FILE_TOOLS: Final[tuple[str, ...]] = ("write_file", "edit_file")
#: Where each session's bash calls leave their effect lines (inside the workspace: the sandbox lets
#: bash write nowhere else; the soak links it into ``DIR/effects``).
BASH_LOG: Final = "bash-effects.jsonl"

#: Failpoints that occur in a live turn, with the tags each may carry (None: any).
LIVE_POINTS: Final[tuple[tuple[str, tuple[str | None, ...]], ...]] = (
    ("P0", (None,)),
    ("P1", (None,)),
    ("P2", (None, "soak_once", "bash", "write_file")),
    ("P3", ("soak_once", "soak_recon", "soak_alo", "soak_idem", "bash", "write_file", "edit_file")),
    ("P4", ("soak_once", "soak_recon", "soak_alo", "soak_idem", "bash", "write_file", "edit_file")),
    ("P5", (None, "soak_once", "bash")),
    ("P6", (None,)),
    ("P7", (None,)),
    ("P8", (None,)),
    ("P9", (None,)),
    ("P10", (None,)),
    ("after_journal_event_insert", ("t1_prepare", "t2_outcome")),
)


@dataclass(frozen=True)
class Failpoint:
    """One armed worker: it SIGKILLs itself at ``point`` (tag, after ``skip`` matching hits)."""

    point: str
    tag: str | None
    skip: int

    @property
    def label(self) -> str:
        text = self.point if self.tag is None else f"{self.point}[{self.tag}]"
        return f"{text}+{self.skip}" if self.skip else text

    def env(self) -> dict[str, str]:
        env = {"MAKA_FAILPOINT": self.point, "MAKA_FAILPOINT_SKIP": str(self.skip)}
        if self.tag is not None:
            env["MAKA_FAILPOINT_TAG"] = self.tag
        return env


@dataclass(frozen=True)
class FaultDraw:
    gap_s: float
    kind: FaultKind
    slot: int
    failpoint: Failpoint | None
    stop_s: float


def _call(rng: random.Random, tag: str, written: list[str]) -> dict[str, Any]:
    pick = rng.random()
    if pick < 0.15:
        return {"name": "write_file", "args": {"path": f"w-{tag}.txt", "content": f"v0 {tag}\n"}}
    if pick < 0.25 and written:
        path = written.pop(rng.randrange(len(written)))
        return {"name": "edit_file", "args": {"path": path, "old_text": "v0", "new_text": "v1"}}
    if pick < 0.4:
        line = json.dumps({"tool": "bash", "guarantee": "at-most-once", "tag": tag}, sort_keys=True)
        command = f"sleep 0.{rng.randint(0, 3)}; printf '%s\\n' '{line}' >> {BASH_LOG}"
        return {"name": "bash", "args": {"command": command}}
    name = rng.choice(USER_TOOLS)
    return {"name": name, "args": {"tag": tag, "sleep_ms": rng.choice((0, 50, 200, 600))}}


def session_script(rng: random.Random, index: int, turns: int) -> list[dict[str, Any]]:
    """``turns`` turns of one to three tool steps each, then a closing text step."""
    steps: list[dict[str, Any]] = []
    written: list[str] = []
    for turn in range(1, turns + 1):
        for step in range(rng.randint(1, 3)):
            tag = f"s{index}-t{turn}-c{step}"
            call = _call(rng, tag, written)
            steps.append({"toolCalls": [call]})
            if call["name"] == "write_file":
                written.append(call["args"]["path"])
        steps.append({"text": f"turn {turn} done"})
    return steps


def fault_draws(rng: random.Random, slots: int, gap: tuple[float, float], heartbeat_s: float) -> Any:
    """An endless sequence of fault draws (a generator over ``rng``)."""
    while True:
        kind = rng.choices(FAULT_KINDS, FAULT_WEIGHTS)[0]
        point, tags = rng.choice(LIVE_POINTS)
        failpoint = Failpoint(point, rng.choice(tags), rng.randint(0, 2))
        yield FaultDraw(
            gap_s=rng.uniform(*gap),
            kind=kind,
            slot=rng.randrange(slots),
            failpoint=failpoint if kind == "failpoint" else None,
            stop_s=heartbeat_s + rng.uniform(0.5, 2.0),
        )


def write_scripts(
    seed: int, sessions: int, turns: int, folder: Path, crafted: list[list[dict[str, Any]]] | None = None
) -> tuple[list[Path], random.Random]:
    """Each session's script file (drawn, or ``crafted``), and the generator of the fault schedule."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(sessions):
        path = folder / f"script-{index}.json"
        steps = crafted[index] if crafted is not None else session_script(rng, index, turns)
        path.write_text(json.dumps({"steps": steps}))
        paths.append(path)
    return paths, random.Random(rng.getrandbits(64))
