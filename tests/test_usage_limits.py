"""Token caps, the token counter and the certificate's usage, with real parts.

- A real session on the dev server, its model on the real ``openai`` SDK against the local
  chat-completions server, its policy capping tokens per turn: the step that would pass the cap
  parks the turn ``usage_limit_reached`` before its call (the server's request count proves no call
  was made), ``session status`` and ``session show`` give the turn's usage, the worker's /metrics
  count the committed tokens by provider, model and kind, and the certificate carries the run's
  usage and verifies. Negative control: the same session without the cap runs past it.
- A per-session cap, on the runtime over a real SQLite ledger: a second turn parks where the
  session's sum would pass the cap; without the cap the same step calls the vendor.
- The policy field: validated (``policy_invalid`` with its field path), in the digest only when set.
- Scripted steps may declare usage; it commits like a vendor's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from maka_core.errors import ConfigError, UsageLimitReached
from maka_core.governance import parse_policy, seal_certificate, verify_receipts
from maka_core.governance.policy_file import GovernancePolicy
from maka_core.runtime.contracts import PARK_REASONS
from maka_core.runtime.governed import SessionGovernance
from maka_core.runtime.runtime import Runtime
from maka_core.runtime.session_view import session_view, transcript_lines
from maka_core.runtime.usage_limits import raises_of
from maka_core.settings import load_settings
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from maka_temporal.workers.client.connect import connect
from maka_temporal.workers.client.session_client import start_session
from maka_temporal.workers.host.resume import resume_lost_session, wait_continued
from maka_temporal.workers.host.telemetry import Metrics, OtelPromObserver, Telemetry
from maka_temporal.workers.host.worker import default_runtime
from maka_temporal.workflows.contracts import workflow_id_for
from tests.temporal_support import in_process_worker, run_maka, wait_turn
from tests.test_providers import ChatServer, completion
from tests.test_runtime import IDS, begin, step
from tests.test_telemetry import delta, observed_worker, parse, scrape

MODEL = "usage-model"
SPEC: dict[str, Any] = {"kind": "openai", "model": MODEL}


def _usage(prompt: int, answer: int, cached: int | None = None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": answer,
        "total_tokens": prompt + answer,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def _reply(message: dict[str, Any], usage: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    body = completion(message, finish)
    body["usage"] = usage
    return body


def _read(call_id: str) -> dict[str, Any]:
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'},
    }
    return {"content": None, "tool_calls": [call]}


def _record_policy(db: Path, session_id: str, policy: GovernancePolicy) -> None:
    store = LedgerStore.open(db)
    try:
        store.put_session_policy(session_id, **SessionGovernance(policy).to_record())
    finally:
        store.close()


@pytest.fixture
def chat(monkeypatch: pytest.MonkeyPatch) -> Iterator[ChatServer]:
    server = ChatServer()
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    yield server
    server.httpd.shutdown()


# --- the policy field -----------------------------------------------------------------------------


def test_the_park_reason_is_declared_once() -> None:
    assert "usage_limit_reached" in PARK_REASONS


@pytest.mark.parametrize(
    ("usage", "field"),
    [
        ({"maxTokensPerTurn": 0}, "usage.maxTokensPerTurn"),
        ({"maxTokensPerSession": "100"}, "usage.maxTokensPerSession"),
        ({"maxTokensPerTurn": 1.5}, "usage.maxTokensPerTurn"),
        ({"maxTokens": 100}, "usage.maxTokens"),
        ("100", "usage"),
    ],
)
def test_a_bad_cap_is_refused_with_its_field(usage: Any, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_policy({"usage": usage})
    assert err.value.code == "policy_invalid" and err.value.detail["field"] == field


def test_a_cap_is_in_the_digest_only_when_set() -> None:
    plain = parse_policy({})
    assert parse_policy({"usage": {}}).digest == plain.digest
    assert parse_policy({"usage": {"maxTokensPerTurn": None}}).digest == plain.digest
    capped = parse_policy({"usage": {"maxTokensPerTurn": 100}})
    assert capped.digest != plain.digest
    assert capped.to_json()["usage"] == {"maxTokensPerTurn": 100}
    assert capped.digest != parse_policy({"usage": {"maxTokensPerTurn": 101}}).digest
    # the recorded policy reads back with its cap (what the worker checks)
    again = SessionGovernance.from_record(SessionGovernance(capped).to_record())
    assert again.policy.usage is not None and again.policy.usage.max_tokens_per_turn == 100


# --- the certificate -------------------------------------------------------------------------------


def _certificate(**extra: Any) -> str:
    fields: dict[str, Any] = {
        "certificate_id": "r1_certificate",
        "turn_id": "t1",
        "goal": "go",
        "result": "VERIFIED_SUCCESS",
        "policy_version": "maka-policy/v1",
        "receipt_ids": (),
        "evidence": (),
        "created_at": "2026-01-01T00:00:00.000Z",
        **extra,
    }
    return seal_certificate(**fields).to_line()


def test_a_certificate_without_usage_still_verifies_and_an_edited_usage_does_not() -> None:
    old = _certificate()
    assert "usage" not in json.loads(old) and verify_receipts([old]) == []
    new = _certificate(usage={"input": 60, "output": 20, "total": 80})
    assert json.loads(new)["usage"] == {"input": 60, "output": 20, "total": 80}
    assert verify_receipts([new]) == []
    edited = json.loads(new)
    edited["usage"]["total"] = 8
    (problem,) = verify_receipts([json.dumps(edited)])
    assert problem.code == "certificate_digest_mismatch"


# --- scripted usage --------------------------------------------------------------------------------


def test_a_scripted_step_reports_the_usage_it_declares(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    ws = Workspace.open(tmp_path / "ws")
    store = LedgerStore.open(tmp_path / "ledger.sqlite")
    rt = Runtime(store)
    script = {
        "kind": "script",
        "steps": [{"text": "hi", "usage": {"input": 30, "output": 5}}, {"text": "bye"}],
    }
    try:
        begin(rt, ws)
        step(rt, ws, 0, script)
        step(rt, ws, 1, script)
        view = session_view(store, IDS.session_id, workflow_id="wf").to_json()
    finally:
        rt.close()
        store.close()
    assert view["usage"] == {"input": 30, "output": 5}


@pytest.mark.parametrize(
    ("usage", "where"),
    [({"input": -1}, "steps[0].usage.input"), ({"tokens": 3}, "steps[0].usage"), ({}, "steps[0].usage")],
)
def test_a_bad_scripted_usage_is_refused(usage: dict[str, Any], where: str) -> None:
    from maka_core.providers import ScriptedProvider

    with pytest.raises(ConfigError) as err:
        ScriptedProvider([{"text": "x", "usage": usage}])
    assert err.value.code == "script_invalid" and err.value.detail["where"] == where


# --- a per-session cap, on the runtime ------------------------------------------------------------


@pytest.mark.parametrize("capped", [True, False])
def test_a_session_cap_parks_the_step_that_would_pass_it(
    tmp_path: Path, chat: ChatServer, capped: bool
) -> None:
    (tmp_path / "ws").mkdir()
    ws = Workspace.open(tmp_path / "ws")
    db = tmp_path / "ledger.sqlite"
    if capped:
        _record_policy(db, IDS.session_id, parse_policy({"usage": {"maxTokensPerSession": 100}}))
    store = LedgerStore.open(db)
    metrics = Metrics()
    rt = Runtime(store, observer=OtelPromObserver(None, metrics))
    for _ in range(3):
        chat.reply(200, _reply({"content": "ok"}, _usage(30, 10)))
    try:
        begin(rt, ws)
        step(rt, ws, 0, SPEC)  # 0 used: runs (40)
        assert step(rt, ws, 0, SPEC).replayed  # a retried step: no call, and no count
        counted = parse(metrics.text().decode())
        key = f'maka_model_tokens_total{{kind="input",model="{MODEL}",provider="openai"}}'
        assert counted[key] == 30
        step(rt, ws, 1, SPEC)  # 40 used, ~40 next: 80 <= 100, runs (80)
        if capped:
            with pytest.raises(UsageLimitReached) as err:
                step(rt, ws, 2, SPEC)  # 80 used, ~40 next: 120 > 100
            assert err.value.detail == {
                "stepId": "r1:2",
                "limit": "usage.maxTokensPerSession",
                "cap": 100,
                "used": 80,
                "next": 40,
            }
        else:
            step(rt, ws, 2, SPEC)
    finally:
        rt.close()
        store.close()
    assert len(chat.requests) == (2 if capped else 3)


# --- a real session on the dev server --------------------------------------------------------------


@pytest.mark.temporal
@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize(
    ("mode", "capped"), [("with_tool", True), ("with_tool", False), ("local", True), ("activity", True)]
)
async def test_a_session_parks_before_the_call_that_would_pass_its_turn_cap(
    temporal_server: Any,
    tmp_path: Path,
    ws_dir: Path,
    task_queue: str,
    chat: ChatServer,
    mode: str,
    capped: bool,
) -> None:
    (ws_dir / "a.txt").write_text("alpha\n")
    db = tmp_path / "ledger.sqlite"
    session_id = f"usage-{tmp_path.name}"[-60:]
    usage = {"maxTokensPerTurn": 100} if capped else {}
    _record_policy(db, session_id, parse_policy({"usage": usage}))
    chat.reply(200, _reply(_read("call_1"), _usage(30, 10, cached=20), "tool_calls"))
    chat.reply(200, _reply(_read("call_2"), _usage(30, 10), "tool_calls"))
    chat.reply(200, _reply({"content": "done"}, _usage(30, 10)))  # the call the cap must prevent
    telemetry = Telemetry(metrics_port=0, metrics_host="127.0.0.1")
    client: Client = await connect(temporal_server.address, runtime=telemetry.temporal_runtime())
    async with observed_worker(client, db, task_queue, telemetry):
        port = telemetry.start()
        assert port is not None
        before = scrape(port)
        _, accepted = await start_session(
            client,
            workspace=ws_dir,
            provider=SPEC,
            task_queue=task_queue,
            message="read it twice",
            session_id=session_id,
            model_step_mode=mode,
        )
        status = await wait_turn(client, session_id, accepted.run_id)
        after = scrape(port)

    if capped:
        assert (status.state, status.park_reason) == ("parked", "usage_limit_reached"), status
        assert len(chat.requests) == 2, "the step that would pass the cap made no call"
        totals = {"input": 60, "output": 20, "total": 80, "cacheRead": 20}
    else:
        assert status.state == "idle", status
        assert len(chat.requests) == 3, "without the cap the turn runs past 100 tokens"
        totals = {"input": 90, "output": 30, "total": 120, "cacheRead": 20}

    store = LedgerStore.open(db)
    try:
        view = session_view(store, session_id, workflow_id="wf").to_json()
        lines = transcript_lines(store.events(session_id=session_id))
        receipts = store.receipts(session_id)
    finally:
        store.close()
    (turn,) = view["turns"]
    assert turn["usage"] == totals and view["usage"] == totals
    assert turn["parkReason"] == ("usage_limit_reached" if capped else None)
    usage_line = (
        f"usage: total {totals['total']} (input {totals['input']}, output {totals['output']}, cacheRead 20)"
    )
    assert f"   {usage_line}" in lines and f"-- session {usage_line} --" in lines

    # the counter, read from the worker's /metrics: each committed step once
    def tokens(kind: str) -> float:
        return delta(
            before, after, f'maka_model_tokens_total{{kind="{kind}",model="{MODEL}",provider="openai"}}'
        )

    assert (tokens("input"), tokens("output"), tokens("cached")) == (totals["input"], totals["output"], 20)
    assert not any("sk-test" in key or chat.url in key for key in after)

    # the certificate carries the run's usage, and the export verifies
    (certificate,) = [r for r in receipts if r["kind"] == "execution_certificate"]
    assert certificate["usage"] == totals
    export = tmp_path / "receipts.jsonl"
    export.write_text("".join(json.dumps(r) + "\n" for r in receipts))
    assert verify_receipts(export.read_text().splitlines()) == []
    env = {**os.environ, "MAKA_HOME": str(tmp_path / "home")}
    verified = run_maka("receipts", "verify", str(export), "--json", env=env)
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"] is True, verified.stdout
    shown = run_maka("session", "show", session_id, "--db", str(db), env=env)
    assert shown.returncode == 0 and f"-- session {usage_line} --" in shown.stdout, (
        shown.stdout + shown.stderr
    )
    if capped:
        assert "usage_limit_reached --" in shown.stdout, shown.stdout
    listed = run_maka("session", "receipts", session_id, "--db", str(db), env=env)
    assert f"tokens={totals['total']}" in listed.stdout, listed.stdout + listed.stderr


@pytest.mark.temporal
@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("terminate", [False, True], ids=["woken", "terminated"])
async def test_a_turn_parked_on_its_cap_goes_on_through_maka_resume(
    temporal_server: Any, tmp_path: Path, ws_dir: Path, task_queue: str, chat: ChatServer, terminate: bool
) -> None:
    """The way forward: ``maka resume`` (it wakes the parked open execution, which runs the
    continuation in place; or, the execution terminated first, starts a new one); the continuation
    run is a turn of its own, with its own budget, and makes the call that was held."""
    (ws_dir / "a.txt").write_text("alpha\n")
    db = tmp_path / "ledger.sqlite"
    session_id = f"usage-{tmp_path.name}"[-60:]
    _record_policy(db, session_id, parse_policy({"usage": {"maxTokensPerTurn": 100}}))
    chat.reply(200, _reply(_read("call_1"), _usage(30, 10), "tool_calls"))
    chat.reply(200, _reply(_read("call_2"), _usage(30, 10), "tool_calls"))
    chat.reply(200, _reply({"content": "done"}, _usage(30, 10)))
    client: Client = await connect(temporal_server.address)
    async with in_process_worker(client, db, task_queue):
        _, accepted = await start_session(
            client,
            workspace=ws_dir,
            provider=SPEC,
            task_queue=task_queue,
            message="go",
            session_id=session_id,
        )
        status = await wait_turn(client, session_id, accepted.run_id)
        assert status.park_reason == "usage_limit_reached" and len(chat.requests) == 2, status
        if terminate:
            await client.get_workflow_handle(workflow_id_for(session_id)).terminate(reason="go on")
        with LedgerStore.open(db) as store:
            rt = default_runtime(store, load_settings().runtime_settings())
            try:
                out = await resume_lost_session(client, rt, session_id, task_queue=task_queue)
                assert out["decision"] == "continue" and out.get("woken", False) is not terminate, out
                out = await wait_continued(client, rt, out, lambda *a, **k: None)
            finally:
                rt.close()
    assert out["state"] == "idle", out
    assert len(chat.requests) == 3, "the held call was made once, in the continuation"
    with LedgerStore.open(db) as store:
        view = session_view(store, session_id, workflow_id="wf").to_json()
    by_run = {t["runId"]: t["usage"] for t in view["turns"]}
    assert by_run[out["sourceRunId"]]["total"] == 80 and by_run[out["continuationRunId"]]["total"] == 40


# --- a spent per-session cap, raised by an operator -------------------------------------------------


@pytest.mark.temporal
@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("raised", [True, False])
async def test_a_session_parked_on_its_spent_cap_goes_on_once_an_operator_raises_it(
    temporal_server: Any, tmp_path: Path, ws_dir: Path, task_queue: str, chat: ChatServer, raised: bool
) -> None:
    """The session spends 80 of its 100 tokens and parks before the call that would pass them.
    ``maka session raise-limit`` (refusals first: nothing written) records the raise; the parked
    execution is ended and ``maka resume`` continues: the held call is made and the turn ends;
    ``session status --json``, ``session show`` and ``maka audit`` show the raise. Control: without
    the raise, the continuation parks ``usage_limit_reached`` again with no call made."""
    (ws_dir / "a.txt").write_text("alpha\n")
    db = tmp_path / "ledger.sqlite"
    session_id = f"raise-{tmp_path.name}"[-60:]
    _record_policy(db, session_id, parse_policy({"usage": {"maxTokensPerSession": 100}}))
    chat.reply(200, _reply(_read("call_1"), _usage(30, 10), "tool_calls"))
    chat.reply(200, _reply(_read("call_2"), _usage(30, 10), "tool_calls"))
    chat.reply(200, _reply({"content": "done"}, _usage(30, 10)))
    env = {**os.environ, "MAKA_HOME": str(tmp_path / "home")}

    def cli(*args: str) -> Any:
        done = run_maka(*args, "--db", str(db), env=env)
        return done.returncode, json.loads(done.stdout) if done.stdout.strip() else done.stderr

    client: Client = await connect(temporal_server.address)
    async with in_process_worker(client, db, task_queue):
        _, accepted = await start_session(
            client, workspace=ws_dir, provider=SPEC, task_queue=task_queue, message="go",
            session_id=session_id,
        )  # fmt: skip
        status = await wait_turn(client, session_id, accepted.run_id)
        assert status.park_reason == "usage_limit_reached" and len(chat.requests) == 2, status

        # refusals, nothing written
        base = ("session", "raise-limit", session_id, "--by", "ops", "--reason", "budget approved", "--json")
        for value, code in (("80", "usage_limit_below_used"), ("100", "usage_limit_not_raised"),
                            ("2e3", "config_invalid"), ("-5", "config_invalid")):  # fmt: skip
            rc, out = cli(*base, "--max-tokens-per-session", value)
            assert rc != 0 and out["code"] == code, (value, out)
        rc, out = cli(*base, "--max-tokens-per-turn", "500")
        assert rc != 0 and out["code"] == "usage_limit_not_raised", out  # the policy sets no turn cap
        rc, out = cli("session", "raise-limit", "no-such-session", "--by", "ops", "--reason", "r", "--json",
                      "--max-tokens-per-session", "500")  # fmt: skip
        assert rc != 0 and out["code"] == "session_not_found", out
        with LedgerStore.open(db) as store:
            assert not raises_of(store.events(session_id=session_id)), "a refusal wrote nothing"

        if raised:
            rc, out = cli(*base, "--max-tokens-per-session", "300")
            assert rc == 0 and out["caps"] == {"maxTokensPerSession": 300}, out
            assert out["previous"] == {"maxTokensPerSession": 100} and out["used"] == {
                "maxTokensPerSession": 80
            }
            assert (out["raisedBy"], out["reason"]) == ("ops", "budget approved")
        # The way on from a park: end the parked execution, then ``maka resume``.
        await client.get_workflow_handle(workflow_id_for(session_id)).terminate(reason="go on")
        with LedgerStore.open(db) as store:
            rt = default_runtime(store, load_settings().runtime_settings())
            try:
                out = await resume_lost_session(client, rt, session_id, task_queue=task_queue)
                assert out["decision"] == "continue", out
                out = await wait_continued(client, rt, out, lambda *a, **k: None)
            finally:
                rt.close()

    if not raised:  # the policy's cap, spent: the continuation parks again, no call made
        assert out["state"] == "parked" and len(chat.requests) == 2, out
        return
    assert out["state"] == "idle" and len(chat.requests) == 3, out
    rc, view = cli("session", "status", session_id, "--json")
    assert rc == 0 and view["usageLimits"] == {"maxTokensPerSession": 300}, view
    assert [r["raisedBy"] for r in view["limitRaises"]] == ["ops"] and view["usage"]["total"] == 120
    assert [t["runId"] for t in view["turns"]] == [accepted.run_id, out["continuationRunId"]], view["turns"]
    shown = run_maka("session", "show", session_id, "--db", str(db), env=env).stdout
    assert "-- operator ops raised usage.maxTokensPerSession 100 -> 300: budget approved --" in shown, shown
    rc, report = cli("audit", session_id, "--address", temporal_server.address, "--json")
    assert rc == 0 and report["ok"] is True, report
    (raise_run,) = [r for r in report["runs"] if "usageLimitRaise" in r]
    assert raise_run["usageLimitRaise"]["caps"] == {"maxTokensPerSession": 300}


# --- a kill right after the raise commits -------------------------------------------------------------

_KILLED_RAISE = """
import os, signal, sys
from maka_core.runtime.usage_limits import raise_limit
from maka_core.store.writer import LedgerStore


class Killed:
    '''The store, killed (SIGKILL) right after the raise's first commit returns.'''

    def __init__(self, inner, two_commits):
        self.inner, self.two_commits = inner, two_commits

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def commit_terminal(self, event, header=None):
        if self.two_commits:  # the order before the fix: the fact, then its header in a second commit
            self.inner.commit_terminal(event)
            os.kill(os.getpid(), signal.SIGKILL)
            self.inner.put_run(header)
        self.inner.commit_terminal(event, header)
        os.kill(os.getpid(), signal.SIGKILL)


with LedgerStore.open(sys.argv[1]) as store:
    raise_limit(Killed(store, sys.argv[2] == "two_commits"), "s-kill", caps={"maxTokensPerSession": 500},
                raised_by="ops", reason="budget")
"""


@pytest.mark.parametrize("variant", ["one_transaction", "two_commits"])
def test_a_raise_killed_after_its_commit_leaves_its_run_header(tmp_path: Path, variant: str) -> None:
    """The raise's fact and its run's header commit in one transaction: a SIGKILL right after it
    leaves both (the cap raised, no ``run_header_missing``). Control: the fact and the header in two
    commits (the order before), killed between them: the audit finds the header missing forever."""
    import signal
    import subprocess
    import sys

    from maka_core.audit.model import read_ledger
    from maka_core.audit.report import audit

    db = tmp_path / "ledger.sqlite"
    with LedgerStore.open(db) as store:
        policy = SessionGovernance(parse_policy({"usage": {"maxTokensPerSession": 100}}))
        store.put_session_policy("s-kill", **policy.to_record())
    child = subprocess.run(
        [sys.executable, "-c", _KILLED_RAISE, str(db), variant], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == -signal.SIGKILL, (child.returncode, child.stderr)
    with LedgerStore.open(db) as store:
        assert len(raises_of(store.events(session_id="s-kill"))) == 1
        missing = [
            f for f in audit(read_ledger(store, "s-kill"), []).findings if f.check == "run_header_missing"
        ]
        headers = [r.run_id for r in store.list_runs(session_id="s-kill")]
    if variant == "two_commits":
        assert missing and not headers, (missing, headers)
        return
    assert not missing and len(headers) == 1 and headers[0].startswith("resolution-"), (missing, headers)


# --- a raise, on the ledger alone ---------------------------------------------------------------------

_SCRIPT = {
    "kind": "script",
    "steps": [{"text": f"s{k}", "usage": {"input": 30, "output": 10}} for k in range(3)],
}


@pytest.mark.parametrize("raised", [True, False])
def test_a_refusal_names_the_cap_in_force_and_whether_an_operator_raised_it(
    tmp_path: Path, raised: bool
) -> None:
    """80 used at a cap of 100; raised to 110, the third step (about 40 more) still passes it: the
    refusal gives the raised cap, the cap in force, with ``raised: true``. Control: the policy's cap."""
    from maka_core.runtime.usage_limits import raise_limit

    (tmp_path / "ws").mkdir()
    ws = Workspace.open(tmp_path / "ws")
    db = tmp_path / "ledger.sqlite"
    _record_policy(db, IDS.session_id, parse_policy({"usage": {"maxTokensPerSession": 100}}))
    store = LedgerStore.open(db)
    rt = Runtime(store)
    try:
        begin(rt, ws)
        step(rt, ws, 0, _SCRIPT)
        step(rt, ws, 1, _SCRIPT)
        if raised:
            raise_limit(store, IDS.session_id, caps={"maxTokensPerSession": 110}, raised_by="ops", reason="r")
        with pytest.raises(UsageLimitReached) as err:
            step(rt, ws, 2, _SCRIPT)
    finally:
        rt.close()
        store.close()
    cap = 110 if raised else 100
    assert err.value.detail == {
        "stepId": "r1:2", "limit": "usage.maxTokensPerSession", "cap": cap, "used": 80, "next": 40,
        **({"raised": True} if raised else {}),
    }  # fmt: skip
    assert f"the cap in force, usage.maxTokensPerSession of {cap}" in err.value.message, err.value.message


def _policy_only(db: Path, session_id: str = "s-raise") -> None:
    _record_policy(db, session_id, parse_policy({"usage": {"maxTokensPerSession": 100}}))


def test_two_raises_that_raced_leave_the_higher_cap(tmp_path: Path) -> None:
    """Operator B read the ledger before A's raise to 1000 committed and raises to 300, each above
    the cap B read: the lower raise lands last, yet the cap in force stays 1000. Control: the raise
    latest in ledger order is the lower one (a rule "the latest stands" would lower the cap)."""
    from maka_core.runtime.usage_limits import limits_in_force, raise_limit

    db = tmp_path / "ledger.sqlite"
    _policy_only(db)
    with LedgerStore.open(db) as store:
        stale = store.events(session_id="s-raise")

        class StaleReads:  # B's read, from before A's commit
            def __getattr__(self, name: str) -> Any:
                return getattr(store, name)

            def events(self, **_: Any) -> list[Any]:
                return list(stale)

        raise_limit(store, "s-raise", caps={"maxTokensPerSession": 1000}, raised_by="A", reason="big")
        raise_limit(StaleReads(), "s-raise", caps={"maxTokensPerSession": 300}, raised_by="B", reason="small")
        events = store.events(session_id="s-raise")
        policy = SessionGovernance.from_record(store.session_policy("s-raise")).policy.usage
        view = session_view(store, "s-raise", workflow_id="wf").to_json()
    assert [r["caps"]["maxTokensPerSession"] for r in raises_of(events)] == [1000, 300]  # the control
    in_force = limits_in_force(policy, events)
    assert in_force is not None and in_force.max_tokens_per_session == 1000
    assert view["usageLimits"] == {"maxTokensPerSession": 1000}, view


def test_the_cli_names_the_way_forward_from_a_usage_park(tmp_path: Path) -> None:
    """A usage park takes no ``session send``: the raise says ``maka resume`` (which wakes the parked
    execution: ``test_a_turn_parked_on_its_cap_goes_on_through_maka_resume[woken]``), and no longer
    to terminate it first."""
    db = tmp_path / "ledger.sqlite"
    _policy_only(db)
    env = {**os.environ, "MAKA_HOME": str(tmp_path / "home")}
    done = run_maka(
        "session", "raise-limit", "s-raise", "--max-tokens-per-session", "500", "--by", "ops",
        "--reason", "budget", "--db", str(db), env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "terminate" not in done.stdout and "maka resume s-raise" in done.stdout, done.stdout
    assert "session send" not in done.stdout, done.stdout


def test_a_raise_prints_inertly_in_show_and_audit(tmp_path: Path) -> None:
    """``session show`` and ``maka audit``'s text name the operator and the raise; an imported raise
    of any shape (caps not a mapping, a newline in a name) prints on one line, never a crash."""
    from maka_core.audit import text
    from maka_core.audit.model import read_ledger
    from maka_core.audit.report import audit
    from maka_core.facts.events import Actions
    from maka_core.runtime.usage_limits import RAISE_KEY, RAISE_PROTOCOL, raise_limit

    db = tmp_path / "ledger.sqlite"
    _policy_only(db)
    with LedgerStore.open(db) as store:
        raise_limit(store, "s-raise", caps={"maxTokensPerSession": 500}, raised_by="ops", reason="budget")
        events = store.events(session_id="s-raise")
        report = audit(read_ledger(store, "s-raise"), []).to_json()
    runs = [line for line in text.report_lines(report) if line.startswith("run ")]
    assert len(runs) == 1 and runs[0].endswith(
        "recorded by operator ops (raised usage.maxTokensPerSession 100 -> 500)"
    ), runs
    assert "-- operator ops raised usage.maxTokensPerSession 100 -> 500: budget --" in transcript_lines(
        events
    )
    bad = events[0].model_copy(
        update={
            "actions": Actions(
                end_invocation=True,
                state_delta={
                    RAISE_KEY: {"protocol": RAISE_PROTOCOL, "caps": "x\n-- forged --", "raisedBy": "a\nb"}
                },
            )
        }
    )
    lines = [line for line in transcript_lines([bad]) if "operator" in line]
    assert lines == ["-- operator a\\nb raised caps x\\n-- forged --: None --"], lines


def test_a_turn_cap_raise_is_not_held_to_the_last_turns_spend(tmp_path: Path) -> None:
    """A turn whose last call answered more than estimated spent 150 at a turn cap of 100: a raise
    of the turn cap to 120 is recorded (the continuation has a fresh turn budget), and the answer
    gives the next call's estimate (110, the last step's). Control: the session cap, which counts
    every turn, is still held to the 150 spent (``usage_limit_below_used``)."""
    from maka_core.errors import LimitRaiseRefused
    from maka_core.runtime.usage_limits import raise_limit

    script = {
        "kind": "script",
        "steps": [
            {"text": "a", "usage": {"input": 30, "output": 10}},
            {"text": "b", "usage": {"input": 100, "output": 10}},
        ],
    }
    (tmp_path / "ws").mkdir()
    ws = Workspace.open(tmp_path / "ws")
    db = tmp_path / "ledger.sqlite"
    _record_policy(
        db, IDS.session_id, parse_policy({"usage": {"maxTokensPerTurn": 100, "maxTokensPerSession": 1000}})
    )
    store = LedgerStore.open(db)
    rt = Runtime(store)
    try:
        begin(rt, ws)
        step(rt, ws, 0, script)
        step(rt, ws, 1, script)  # 40 used, ~40 next: admitted; it answers 110
        with pytest.raises(LimitRaiseRefused) as err:
            raise_limit(store, IDS.session_id, caps={"maxTokensPerSession": 120}, raised_by="ops", reason="r")
        done = raise_limit(store, IDS.session_id, caps={"maxTokensPerTurn": 120}, raised_by="ops", reason="r")
    finally:
        rt.close()
        store.close()
    assert err.value.code == "usage_limit_below_used" and err.value.detail["used"] == 150, err.value.detail
    assert done["previous"] == {"maxTokensPerTurn": 100} and done["used"] == {"maxTokensPerTurn": 150}, done
    assert done["nextCall"] == 110, done
