"""Parallel tool calls on a real dev server (issue 31 item 2, ``workflows.fanout``).

One model step asks for four ``nap`` calls (read-only: parallel-safe), two ``nap_alone`` calls
(declared ``parallel=False``) and one ``stamp`` (at-most-once: not parallel-safe), in that
interleaved order. With ``max_parallel_tools`` 8 the naps overlap, while the calls that are not
parallel-safe run one at a time in the model's order; every call runs once, the next model step
starts only after all of them, and ``maka audit`` is clean. In activity mode and in hybrid mode
(local activities). Control: ``max_parallel_tools`` 1, the same calls (without the naps' meeting,
which would only wait in vain), runs one call at a time and asks no patch (its history is one a
worker before the patch would write).
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType

from maka_core.runtime.contracts import SessionConfig
from maka_core.runtime.runtime import Runtime, RuntimeSettings
from maka_core.store.writer import LedgerStore
from maka_core.tools.registry import default_tools
from maka_temporal.workflows.contracts import workflow_id_for
from maka_temporal.workflows.session_policy import STEP_PATCHES
from tests.temporal_support import in_process_worker, start, tool_step, wait_turn, write_script
from tests.test_hybrid_tools import audit_clean
from tests.user_tools_pkg import naps

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]

NAP_S = 0.8
NAPS = ["n1", "n2", "n3", "n4"]


def calls(meet: bool) -> list[tuple[str, dict[str, Any]]]:
    """The step's calls; with ``meet`` each nap sleeps only once all four naps and ``a1`` have
    started (and ``a1`` once ``n1`` has), so calls dispatched side by side overlap however late a
    loaded machine started each one, and calls run one at a time do not (each waits ``naps.MEET_S``
    in vain)."""
    nap_meet = {"meet": [*NAPS, "a1"]} if meet else {}
    lone_meet = {"meet": ["n1"]} if meet else {}
    return [
        ("nap", {"label": "n1", "seconds": NAP_S, **nap_meet}),
        ("nap_alone", {"label": "a1", "seconds": 0.3, **lone_meet}),
        ("nap", {"label": "n2", "seconds": NAP_S, **nap_meet}),
        ("stamp", {"text": "s1"}),
        ("nap", {"label": "n3", "seconds": NAP_S, **nap_meet}),
        ("nap_alone", {"label": "a2", "seconds": 0.3}),
        ("nap", {"label": "n4", "seconds": NAP_S, **nap_meet}),
    ]


def make_runtime(store: LedgerStore, settings: RuntimeSettings) -> Runtime:
    return Runtime(store, settings=settings, tools={**default_tools(), **{t.name: t for t in naps.TOOLS}})


def spans(ws: Path) -> dict[str, tuple[float, float]]:
    """Each run's (start, end) from ``naps.log``; a label that ran twice fails here."""
    starts: dict[str, float] = {}
    ends: dict[str, float] = {}
    for line in (ws / "naps.log").read_text().splitlines():
        kind, label, at = line.split()
        book = starts if kind == "start" else ends
        assert label not in book, f"{label} ran twice: {line}"
        book[label] = float(at)
    assert starts.keys() == ends.keys()
    return {label: (starts[label], ends[label]) for label in starts}


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def patch_markers(history: Any) -> list[str]:
    """Every marker's name and payloads, as text (a patch marker holds its id)."""
    out = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            attrs = event.marker_recorded_event_attributes
            data = [p.data.decode(errors="replace") for v in attrs.details.values() for p in v.payloads]
            out.append(" ".join([attrs.marker_name, *data]))
    return out


def most_scheduled_together(history: Any) -> int:
    """The most activities one workflow task scheduled."""
    most = count = 0
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            count = 0
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            count += 1
            most = max(most, count)
    return most


@pytest.mark.parametrize(("tool_mode", "limit"), [("activity", 8), ("hybrid", 8), ("activity", 1)])
async def test_a_steps_calls_run_side_by_side_and_the_unsafe_ones_one_at_a_time_in_order(
    tool_mode: str, limit: int, temporal_server: Any, temporal_client: Any, tmp_path: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    ws = tmp_path / "ws"
    ws.mkdir()
    script = write_script(tmp_path / "s.json", [tool_step(*calls(meet=limit > 1)), {"text": "done"}])
    async with in_process_worker(temporal_client, db, task_queue, make_runtime=make_runtime):
        sid, acc = await start(
            temporal_client, ws, script, task_queue, "go", tool_mode=tool_mode, max_parallel_tools=limit
        )
        status = await wait_turn(temporal_client, sid, acc.run_id)
        history = await temporal_client.get_workflow_handle(workflow_id_for(sid)).fetch_history()
    assert status.state == "idle", status
    got = spans(ws)
    assert sorted(got) == ["a1", "a2", "n1", "n2", "n3", "n4"]
    assert (ws / "stamps.log").read_text() == "s1\n"  # the at-most-once call ran once
    naps_ = [got[n] for n in NAPS]
    a1, a2 = got["a1"], got["a2"]
    assert a1[1] <= a2[0], (a1, a2)  # the calls that are not parallel-safe: in the model's order
    if limit > 1:
        assert any(STEP_PATCHES in m for m in patch_markers(history)), patch_markers(history)
        latest_start = max(s for s, _ in naps_)
        earliest_end = min(e for _, e in naps_)
        assert latest_start < earliest_end, f"the naps did not all overlap: {got}"
        assert any(overlap(a1, n) for n in naps_), f"a lone call ran beside no parallel call: {got}"
    else:
        assert most_scheduled_together(history) == 1  # the control's history: the loop of before
        ordered = sorted(got.values())
        assert all(x[1] <= y[0] for x, y in itertools.pairwise(ordered)), ordered
    await audit_clean(db, temporal_server.address)


async def test_the_setting_is_checked_where_it_enters() -> None:
    from maka_core.errors import ConfigError
    from maka_temporal.workers.client.session_start import new_session_config

    spec = {"kind": "script", "steps": [{"text": "hi"}]}
    assert new_session_config(spec).max_parallel_tools == 8
    assert new_session_config(spec, max_parallel_tools=1).max_parallel_tools == 1
    assert new_session_config(spec).status_json()["maxParallelTools"] == 8  # session status --json
    recorded = SessionConfig.from_json({"provider": spec, "maxStepsPerTurn": 5})  # a record from before
    assert recorded is not None and recorded.max_parallel_tools == 1  # one call at a time, as it ran
    for bad in (0, 65):
        with pytest.raises(ConfigError) as err:
            new_session_config(spec, max_parallel_tools=bad)
        assert err.value.code == "config_invalid" and re.search("max_parallel_tools", err.value.message)
