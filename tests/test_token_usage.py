"""Token usage on the ledger: each model step commits its vendor's usage as Maka's ``tokenUsage``
action, in the step's own transaction; ``session status --json`` sums it per turn and per session.

Real parts: the runtime over a real SQLite ledger, the real ``openai`` SDK against the local
chat-completions server of ``tests/test_providers.py``, and a child process SIGKILLed inside the
step's commit (store failpoint ``after_runtime_event_insert``). Negative control: a ledger that
commits each event of a batch on its own (usage after the output) loses the step's usage for good
at the same kill, since the retried step finds its output committed and never calls the vendor again.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from maka_core.facts.events import RuntimeEvent
from maka_core.providers import ProviderError
from maka_core.runtime.runtime import Runtime
from maka_core.runtime.session_view import session_view
from maka_core.store.writer import CommitResult, LedgerStore
from maka_core.workspace import Workspace
from tests.temporal_support import REPO
from tests.test_providers import ChatServer, completion
from tests.test_runtime import IDS, begin, step

SPEC: dict[str, Any] = {"kind": "openai", "model": "usage-model"}
USAGE = {"input": 11, "output": 7, "total": 18, "rawFinishReason": "stop"}


class SplitLedger(LedgerStore):
    """The broken variant: every event of a batch in a transaction of its own."""

    def append(self, events: Sequence[RuntimeEvent]) -> CommitResult:
        results = [super(SplitLedger, self).append([e]) for e in events]
        return results[-1]


@pytest.fixture
def chat(monkeypatch: pytest.MonkeyPatch) -> Iterator[ChatServer]:
    server = ChatServer()
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    yield server
    server.httpd.shutdown()


def _workspace(tmp_path: Path) -> Workspace:
    (tmp_path / "ws").mkdir()
    return Workspace.open(tmp_path / "ws")


def _usage_events(db: Path) -> dict[str, dict[str, Any]]:
    store = LedgerStore.open(db)
    try:
        return {
            e.id: e.actions.token_usage
            for e in store.events(session_id=IDS.session_id)
            if e.actions is not None and e.actions.token_usage is not None
        }
    finally:
        store.close()


def test_each_step_commits_its_usage_once_and_status_sums_it(tmp_path: Path, chat: ChatServer) -> None:
    db, ws = tmp_path / "ledger.sqlite", _workspace(tmp_path)
    store = LedgerStore.open(db)
    rt = Runtime(store)
    try:
        begin(rt, ws)
        chat.reply(200, completion({"content": "one"}))
        step(rt, ws, 0, SPEC)
        assert step(rt, ws, 0, SPEC).replayed  # a retried step finds its output: no second request
        second = completion({"content": "two"})
        second["usage"] = {
            "prompt_tokens": 30,
            "completion_tokens": 4,
            "total_tokens": 34,
            "prompt_tokens_details": {"cached_tokens": 20},
        }
        chat.reply(200, second)
        step(rt, ws, 1, SPEC)
        # A vendor whose counts are not counts (nulls): the step is refused, nothing of it commits
        # (its usage was once dropped and the step committed: a step no cap could count).
        bad = completion({"content": "three"})
        bad["usage"] = {"prompt_tokens": None, "completion_tokens": None, "total_tokens": None}
        chat.reply(200, bad)
        with pytest.raises(ProviderError) as refused:
            step(rt, ws, 2, SPEC)
        assert (refused.value.code, refused.value.retryable) == ("usage_invalid", False)
        assert refused.value.detail["field"] == "input"
        assert not store.view(IDS.session_id).step_events("r1:2")
        view = session_view(store, IDS.session_id, workflow_id="wf")
    finally:
        rt.close()
        store.close()
    assert len(chat.requests) == 3
    assert _usage_events(db) == {
        "r1:0:usage": USAGE,
        "r1:1:usage": {"input": 30, "output": 4, "total": 34, "cacheRead": 20, "rawFinishReason": "stop"},
    }
    totals = {"input": 41, "output": 11, "total": 52, "cacheRead": 20}
    (turn,) = view.to_json()["turns"]
    assert turn["usage"] == totals and view.to_json()["usage"] == totals


def test_a_session_without_reported_usage_says_none_not_zero(tmp_path: Path) -> None:
    db, ws = tmp_path / "ledger.sqlite", _workspace(tmp_path)
    store = LedgerStore.open(db)
    rt = Runtime(store)
    try:
        begin(rt, ws)
        step(rt, ws, 0, {"kind": "script", "steps": [{"text": "hi"}]})
        out = session_view(store, IDS.session_id, workflow_id="wf").to_json()
    finally:
        rt.close()
        store.close()
    assert out["usage"] is None and out["turns"][0]["usage"] is None


def _killed_step(db: Path, ws: Workspace, variant: str) -> int:
    env = {
        **os.environ,
        "MAKA_FAILPOINT": "after_runtime_event_insert",
        "MAKA_FAILPOINT_TAG": "generic_append",
        "MAKA_FAILPOINT_SKIP": "1",  # the step's text is inserted; die inserting its usage
    }
    child = [sys.executable, "-m", "tests.children.usage_step", str(db), str(ws.root), "0", variant]
    return subprocess.run(child, cwd=REPO, env=env, capture_output=True, timeout=120).returncode


@pytest.mark.parametrize(("variant", "kept"), [("batch", True), ("split", False)])
def test_a_kill_inside_the_steps_commit_never_loses_its_usage(
    tmp_path: Path, chat: ChatServer, variant: str, kept: bool
) -> None:
    db, ws = tmp_path / "ledger.sqlite", _workspace(tmp_path)
    store = LedgerStore.open(db)
    rt = Runtime(store)
    try:
        begin(rt, ws)
    finally:
        rt.close()
        store.close()
    chat.reply(200, completion({"content": "one"}))
    chat.reply(200, completion({"content": "one"}))
    assert _killed_step(db, ws, variant) == -9
    store = LedgerStore.open(db)
    rt = Runtime(store)
    try:
        step(rt, ws, 0, SPEC)  # the workflow's retry of the step, in a fresh worker
        texts = [e.id for e in store.events(session_id=IDS.session_id) if e.id.endswith(":text")]
    finally:
        rt.close()
        store.close()
    assert texts == ["r1:0:text"]
    if kept:  # one transaction: nothing survived the kill, the retry called the vendor once more
        assert len(chat.requests) == 2 and _usage_events(db) == {"r1:0:usage": USAGE}
    else:  # the output survived alone: the retry replays it, and the step's usage is gone for good
        assert len(chat.requests) == 1 and _usage_events(db) == {}
