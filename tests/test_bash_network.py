"""The network for ``bash`` takes two keys: the worker's ``--bash-network`` and the session policy's
``allowNetwork``. Real bwrap, real bash, a real ledger, and a TCP server this test runs on
127.0.0.1 (loopback only, every wait bounded): the same command connects with both keys and cannot
with either one alone (the negative controls); a failed connection is an ordinary command result;
a granted call's decision (recorded with T1) and receipt say ``network``, and its guarantee stays
``at-most-once``; the policy field is validated and absent from the digest unless set.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from maka_core.errors import ConfigError
from maka_core.facts import canonical_json
from maka_core.governance import parse_policy
from maka_core.runtime import approvals, recovery, tool_call
from maka_core.runtime.governed import DEFAULT_SESSION_POLICY, decision_record, judge, network_for
from maka_core.runtime.runtime import Runtime
from maka_core.settings import load_settings
from maka_core.store.schema import tool_decisions
from maka_core.store.writer import LedgerStore
from maka_core.tools import BashTool, sandbox_status
from maka_core.tools.registry import default_tools
from maka_core.workspace import Workspace
from tests.test_governed_execution import _until_pending, receipts, result_of, with_policy
from tests.test_runtime import ATTEMPT, one_call, prepare_only, recover_input, run, tool_input

STATUS = sandbox_status()
needs_bwrap = pytest.mark.skipif(not STATUS.available, reason=f"bwrap cannot run here: {STATUS.reason}")
BASH_EVIDENCE: dict[str, Any] = {
    "mutations": "allow",
    "defaultEvidence": {"bash": [{"type": "exit_code", "value": 0}]},
}
GREETING = "hello-from-loopback"


@dataclass
class LoopbackServer:
    """A TCP server on 127.0.0.1 that greets every client and counts them."""

    listener: socket.socket
    accepted: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def command(self) -> str:
        """The one command every case runs: connect, read the greeting, print it."""
        return f"exec 3<>/dev/tcp/127.0.0.1/{self.port} && head -c {len(GREETING)} <&3 && echo"

    def serve(self) -> None:
        self.listener.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, peer = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.sendall(GREETING.encode())
                self.accepted.append(peer[0])


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        srv = LoopbackServer(listener)
        thread = threading.Thread(target=srv.serve, daemon=True)
        thread.start()
        try:
            yield srv
        finally:
            srv.stop.set()
            thread.join(timeout=5)


def networked_runtime(store: LedgerStore, *, worker_flag: bool) -> Runtime:
    """The runtime a ``maka worker`` builds, with or without ``--bash-network``."""
    return Runtime(store, tools=default_tools(bash_network=worker_flag))


def call_bash(rt: Runtime, ws: Workspace, command: str) -> tuple[str, dict[str, Any]]:
    ref = one_call(rt, ws, "bash", {"command": command})
    outcome = run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
    return ref.operation_id, result_of(rt, outcome.response_event_id)


def _output(value: dict[str, Any]) -> str:
    return str(value.get("stdout", "")) + str(value.get("stderr", ""))


# --- the two keys, end to end through the tool path ------------------------------------------------


@needs_bwrap
@pytest.mark.parametrize("store_url", ["sqlite-file"], indirect=True)
@pytest.mark.parametrize(
    ("worker_flag", "allow_network"),
    [(True, True), (True, False), (False, True), (False, False)],
    ids=["both-keys", "worker-only", "policy-only", "neither"],
)
def test_bash_has_the_network_only_with_both_keys(
    store: LedgerStore,
    ws: Workspace,
    server: LoopbackServer,
    worker_flag: bool,
    allow_network: bool,
) -> None:
    rt = networked_runtime(store, worker_flag=worker_flag)
    try:
        with_policy(rt, {**BASH_EVIDENCE, **({"allowNetwork": True} if allow_network else {})})
        op_id, value = call_bash(rt, ws, server.command())
        held = rt.ledger.decision(op_id)
        (receipt,) = receipts(rt)
    finally:
        rt.close()
    assert held is not None
    decision = held["decision"]
    if worker_flag and allow_network:
        assert value["exitCode"] == 0 and value["stdout"].strip() == GREETING, value
        assert server.accepted == ["127.0.0.1"]
        assert decision["network"] is True  # recorded with T1: an auditor sees the grant
        assert receipt["observedEffect"] == {"status": "verified_success", "network": True}
    else:
        # The same command, one key missing: no route to the host's loopback, and nothing accepted.
        # The failed connection is the command's own result (its exit code and stderr), not a refusal.
        assert value["exitCode"] != 0 and GREETING not in value.get("stdout", ""), value
        assert "code" not in value or value["code"] != "policy_blocked", value
        said = _output(value)
        assert "refused" in said or "unreachable" in said, said
        assert server.accepted == []
        assert "network" not in decision  # a decision without the grant reads as every older one
        assert "network" not in receipt["observedEffect"]
    assert decision["executionGuarantee"] == "at-most-once"


@needs_bwrap
@pytest.mark.parametrize("store_url", ["sqlite-file"], indirect=True)
def test_a_denied_call_is_given_no_network(store: LedgerStore, ws: Workspace, server: LoopbackServer) -> None:
    rt = networked_runtime(store, worker_flag=True)
    try:
        with_policy(rt, {**BASH_EVIDENCE, "allowNetwork": True, "allowedCommands": ["ls"]})
        op_id, value = call_bash(rt, ws, server.command())
        held = rt.ledger.decision(op_id)
    finally:
        rt.close()
    assert value["code"] == "policy_blocked" and server.accepted == []
    assert held is not None and "network" not in held["decision"]


@needs_bwrap
@pytest.mark.parametrize("store_url", ["sqlite-file"], indirect=True)
def test_one_worker_serves_a_networked_and_an_unnetworked_call_side_by_side(
    store: LedgerStore, ws: Workspace, server: LoopbackServer
) -> None:
    # The worker's own tool is never changed by a granted call: the grant is bound per call.
    rt = networked_runtime(store, worker_flag=True)
    try:
        with_policy(rt, {**BASH_EVIDENCE, "allowNetwork": True})
        _, value = call_bash(rt, ws, server.command())
        assert value["exitCode"] == 0, value
        bash = rt.tools["bash"]
        assert isinstance(bash, BashTool) and bash.network_permitted and not bash.network
        plain = bash.run({"command": server.command()}, ws, lambda: None)
        assert plain.is_error and GREETING not in _output(plain.result["value"])
        granted = bash.with_network(True).run({"command": server.command()}, ws, lambda: None)
        assert not granted.is_error, granted.result
    finally:
        rt.close()
    assert server.accepted == ["127.0.0.1", "127.0.0.1"]


@needs_bwrap
@pytest.mark.parametrize("store_url", ["sqlite-file"], indirect=True)
@pytest.mark.parametrize("worker_flag", [True, False], ids=["networked", "control"])
def test_a_networked_call_is_at_most_once_even_for_a_trusted_read(
    store: LedgerStore, ws: Workspace, worker_flag: bool
) -> None:
    (ws.root / "a.txt").write_text("a\n")
    rt = networked_runtime(store, worker_flag=worker_flag)
    try:
        with_policy(rt, {**BASH_EVIDENCE, "allowNetwork": True, "trustedReadCommands": ["cat"]})
        op_id, value = call_bash(rt, ws, "cat a.txt")
        held = rt.ledger.decision(op_id)
    finally:
        rt.close()
    assert value["stdout"] == "a\n"
    assert held is not None
    # The control (no worker key, so no network): the same trusted read is read-only as before.
    expected = "at-most-once" if worker_flag else "read-only"
    assert held["decision"]["executionGuarantee"] == expected


@needs_bwrap
@pytest.mark.parametrize("store_url", ["sqlite-file"], indirect=True)
@pytest.mark.parametrize("second_flag", [False, True], ids=["keyless-worker", "control"])
def test_an_approved_networked_call_on_a_worker_without_the_key_is_refused_before_t1(
    store: LedgerStore, ws: Workspace, server: LoopbackServer, second_flag: bool
) -> None:
    """The call is decided (and waits for its approval) on a worker with the key; the worker that
    picks it up after the approval has none: refused before T1, nothing connects. The control: a
    second worker with the key runs it once, with the network."""
    rt = networked_runtime(store, worker_flag=True)
    with_policy(rt, {**BASH_EVIDENCE, "mutations": "confirm", "allowNetwork": True})
    ref = one_call(rt, ws, "bash", {"command": server.command()})

    async def first() -> dict[str, Any]:
        task = asyncio.create_task(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
        pending = await _until_pending(rt)
        task.cancel()  # as a killed worker's attempt is
        return pending

    try:
        pending = run(first())
    finally:
        rt.close()
    held = store.decision(ref.operation_id)
    assert held is not None and held["decision"]["network"] is True
    approvals.answer(store, "s1", pending["approvalId"], allow=True, phrase=pending["phrase"])
    second = networked_runtime(store, worker_flag=second_flag)
    try:
        outcome = run(tool_call.execute_tool(second, tool_input(ws, ref), ATTEMPT))
        value = result_of(second, outcome.response_event_id)
    finally:
        second.close()
    dispatched = [e for e in store.events(run_id="r1") if e.actions and e.actions.tool_dispatch]
    if second_flag:
        assert outcome.status == "completed" and value["stdout"].strip() == GREETING, value
        assert server.accepted == ["127.0.0.1"] and len(dispatched) == 1
    else:
        assert outcome.status == "refused" and value["code"] == "bash_network_unavailable", value
        assert server.accepted == [] and dispatched == []


@needs_bwrap
@pytest.mark.parametrize("store_url", ["sqlite-file"], indirect=True)
@pytest.mark.parametrize("worker_flag", [True, False], ids=["networked", "control"])
def test_recovery_parks_a_networked_trusted_read_and_rereads_an_unnetworked_one(
    store: LedgerStore, ws: Workspace, worker_flag: bool
) -> None:
    """T1 (with its decision) and no T2, as a crash after the effect leaves it: the networked call
    parks; the control, the same line without the network, is read again as before."""
    (ws.root / "a.txt").write_text("a\n")
    rt = networked_runtime(store, worker_flag=worker_flag)
    try:
        gov = with_policy(rt, {**BASH_EVIDENCE, "allowNetwork": True, "trustedReadCommands": ["cat"]})
        args = {"command": "cat a.txt"}
        ref = one_call(rt, ws, "bash", args)
        tool = rt.tools["bash"]
        decided = judge(gov, tool, args, worker_forbidden=frozenset(), grant_usage={}, now=datetime.now(UTC))
        record = decision_record(
            decided, tool, gov.policy.trusted_reads, network=network_for(gov.policy, tool)
        )
        prepare_only(rt, ws, ref, args)
        with store.engine.begin() as conn:
            conn.execute(
                tool_decisions.insert().values(
                    operation_id=ref.operation_id, session_id="s1", run_id="r1", state="decided",
                    decision_json=canonical_json.dumps(record), recorded_at=1, updated_at=1,
                )
            )  # fmt: skip
        result = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    finally:
        rt.close()
    if worker_flag:
        assert record["network"] is True and record["executionGuarantee"] == "at-most-once"
        assert (result.status, result.reason) == ("parked", "dispatch_without_response")
    else:
        assert "network" not in record and record["executionGuarantee"] == "read-only"
        assert (result.status, result.reason) == ("completed", "replay_safe_reread")


def test_the_sandbox_argv_differs_by_unshare_net_alone(ws: Workspace) -> None:
    from maka_core.tools.sandbox import bwrap_argv

    def argv(network: bool) -> list[str]:
        built, fds = bwrap_argv(
            "bwrap", ws.root, ["true"], hidden_paths=(), network=network, env={"A": "1"}, marker_name="m"
        )
        assert fds == []
        return built

    closed, opened = argv(False), argv(True)
    assert [a for a in closed if a != "--unshare-net"] == opened and "--unshare-net" in closed


# --- the policy field --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "where"),
    [
        ({"allowNetwork": "true"}, "allowNetwork"),
        ({"allowNetwork": 1}, "allowNetwork"),
        ({"deniedTraits": ["network"], "allowNetwork": True}, "allowNetwork"),
        ({"allowNetwork": True, "deniedTraits": ["package-install", "network"]}, "allowNetwork"),
    ],
)
def test_allow_network_is_validated_with_its_field_path(policy: dict[str, Any], where: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_policy(policy)
    assert caught.value.code == "policy_invalid" and caught.value.detail["field"] == where


# Digests of these policies at c38fdf5, before the field existed.
OLD_DIGESTS = {
    "{}": "sha256:d5bf6e3824469118d160b0e0c5765ca566235ed97c29d58896ec71ad6eab5279",
    '{"mutations": "allow", "trustedReadCommands": ["cat"]}': (
        "sha256:9e44484608b70abdeb83508e820f9de675bf3ff0af152233ac87a225aeaaf94a"
    ),
}


@pytest.mark.parametrize("text", sorted(OLD_DIGESTS))
def test_a_policy_without_the_field_keeps_its_digest(text: str) -> None:
    policy = json.loads(text)
    assert parse_policy(policy).digest == OLD_DIGESTS[text]
    assert parse_policy({**policy, "allowNetwork": False}).digest == OLD_DIGESTS[text]
    granted = parse_policy({**policy, "allowNetwork": True})
    assert granted.digest != OLD_DIGESTS[text] and granted.to_json()["allowNetwork"] is True
    assert DEFAULT_SESSION_POLICY.digest == (
        "sha256:3bbe8b44ac6da4a4b1a850ff50926b3b951f28805d95b2775f1a105dffcb3f9d"
    )


# --- the worker's key ----------------------------------------------------------------------------------


def test_the_worker_key_comes_from_the_flag_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from maka_temporal.workers.host.worker import default_runtime

    monkeypatch.delenv("MAKA_BASH_NETWORK", raising=False)
    assert load_settings().runtime_settings().bash_network is False
    assert load_settings(bash_network=True).runtime_settings().bash_network is True
    monkeypatch.setenv("MAKA_BASH_NETWORK", "1")
    settings = load_settings().runtime_settings()
    assert settings.bash_network is True
    store = LedgerStore.open("sqlite://")
    rt = default_runtime(store, settings)
    try:
        bash = rt.tools["bash"]
        assert isinstance(bash, BashTool) and bash.network_permitted and not bash.network
        assert "allowNetwork" in bash.isolation() or not bash.sandbox.available
    finally:
        rt.close()
    monkeypatch.setenv("MAKA_BASH_NETWORK", "maybe")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert caught.value.code == "config_invalid"


# --- a real session on the dev server --------------------------------------------------------------------


@needs_bwrap
@pytest.mark.temporal
@pytest.mark.slow
@pytest.mark.parametrize("worker_flag", [True, False], ids=["both-keys", "policy-only"])
def test_a_session_with_allow_network_on_a_bash_network_worker(
    temporal_server: Any, tmp_path: Path, ws_dir: Path, server: LoopbackServer, worker_flag: bool
) -> None:
    from tests.temporal_support import WorkerProcess, tool_step, write_script
    from tests.test_cli_session import _env, maka

    home = tmp_path / "home"
    env = _env(home, temporal_server.address)
    script = write_script(
        tmp_path / "s.json", [tool_step(("bash", {"command": server.command()})), {"text": "done"}]
    )
    policy = tmp_path / "p.json"
    policy.write_text(json.dumps({**BASH_EVIDENCE, "allowNetwork": True}))
    entry = ("-m", "maka_temporal", "worker", *(["--bash-network"] if worker_flag else []))
    with WorkerProcess(
        temporal_server, home / "ledger.sqlite", env["MAKA_TASK_QUEUE"], home=home, entry=entry
    ) as worker:
        worker.wait_ready()
        ready = worker.log.read_text()
        assert ("allowNetwork" in ready) is worker_flag, ready
        started = maka(
            "session", "start", "--workspace", str(ws_dir), "--script", str(script),
            "--policy", str(policy), "--wait", "--json", "connect", env=env,
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        session = json.loads(started.stdout)["sessionId"]
        deadline = time.monotonic() + 60
        while True:
            status = json.loads(maka("session", "status", session, "--json", env=env).stdout)
            if status["state"] == "idle":
                break
            assert time.monotonic() < deadline, status
            time.sleep(0.3)
    shown = maka("session", "show", session, "--json", env=env)
    (value,) = [
        e["content"]["result"]["value"]
        for e in map(json.loads, shown.stdout.splitlines())
        if (e.get("content") or {}).get("kind") == "function_response"
    ]
    exported = maka("session", "receipts", session, "--json", env=env)
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in exported.stdout.splitlines() if line.strip()]
    (receipt,) = [line for line in lines if "observedEffect" in line]  # beside it: the certificate
    export = tmp_path / "receipts.jsonl"
    export.write_text(exported.stdout)
    verified = maka("receipts", "verify", str(export), env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    if worker_flag:
        assert value["stdout"].strip() == GREETING and server.accepted == ["127.0.0.1"], value
        assert receipt["observedEffect"]["network"] is True
    else:
        assert value["exitCode"] != 0 and server.accepted == [], value
        assert "network" not in receipt["observedEffect"]


@needs_bwrap
@pytest.mark.temporal
@pytest.mark.slow
@pytest.mark.parametrize(
    ("line", "worker_flag", "settles"),
    [("connect", True, "parked"), ("cat", True, "parked"), ("cat", False, "idle")],
    ids=["networked-connect", "networked-trusted-read", "control-unnetworked-trusted-read"],
)
def test_a_worker_killed_after_a_networked_call_parks_it_and_nothing_runs_twice(
    temporal_server: Any,
    tmp_path: Path,
    ws_dir: Path,
    server: LoopbackServer,
    line: str,
    worker_flag: bool,
    settles: str,
) -> None:
    """P4 (the effect returned, T2 not committed) on a real ``maka worker``; a fresh one settles the
    call. With the network it parks ``dispatch_without_response`` and the server saw one connection;
    the control, the same trusted read without the worker's key, is read again and the turn ends."""
    from tests.temporal_support import WorkerProcess, tool_step, write_script
    from tests.test_cli_session import _env, maka

    (ws_dir / "a.txt").write_text("a\n")
    command = server.command() if line == "connect" else "cat a.txt"
    home = tmp_path / "home"
    env = _env(home, temporal_server.address)
    script = write_script(tmp_path / "s.json", [tool_step(("bash", {"command": command})), {"text": "done"}])
    policy = tmp_path / "p.json"
    policy.write_text(json.dumps({**BASH_EVIDENCE, "allowNetwork": True, "trustedReadCommands": ["cat"]}))
    entry = ("-m", "maka_temporal", "worker", *(["--bash-network"] if worker_flag else []))
    db, queue = home / "ledger.sqlite", env["MAKA_TASK_QUEUE"]
    first = WorkerProcess(
        temporal_server, db, queue, home=home, entry=entry, failpoint="P4", failpoint_tag="bash"
    )
    try:
        first.wait_ready()
        started = maka(
            "session", "start", "--workspace", str(ws_dir), "--script", str(script),
            "--policy", str(policy), "--json", "go", env=env,
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        session = json.loads(started.stdout)["sessionId"]
        assert run(first.wait_exit(60)) != 0  # SIGKILLed at P4
    finally:
        first.stop()
    with WorkerProcess(temporal_server, db, queue, home=home, entry=entry) as second:
        second.wait_ready()
        deadline = time.monotonic() + 90
        while True:
            status = json.loads(maka("session", "status", session, "--json", env=env).stdout)
            if status["state"] in ("parked", "idle"):
                break
            assert time.monotonic() < deadline, status
            time.sleep(0.3)
    assert status["state"] == settles, status
    if settles == "parked":
        assert status["parkReason"] == "dispatch_without_response", status
    if line == "connect":
        assert server.accepted == ["127.0.0.1"]  # once, by the killed worker; never again


@pytest.mark.temporal
@pytest.mark.slow
@pytest.mark.parametrize("flag", [True, False], ids=["bash-network", "control"])
def test_maka_dev_takes_the_worker_key(tmp_path: Path, flag: bool) -> None:
    import os
    import subprocess
    import sys

    from maka_temporal.workers.host.devserver import free_port
    from tests.temporal_support import REPO

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("MAKA_BASH_NETWORK", "MAKA_DB", "MAKA_POLICY")}
    env.update({"MAKA_HOME": str(tmp_path / "home"), "MAKA_TASK_QUEUE": f"dev-net-{port}"})
    argv = [sys.executable, "-m", "maka_temporal", "dev", "--json", "--port", str(port)]
    proc = subprocess.Popen(
        [*argv, *(["--bash-network"] if flag else [])],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    seen: list[dict[str, Any]] = []
    try:
        assert proc.stdout is not None
        for text in proc.stdout:  # ends at EOF if the process exits
            seen.append(json.loads(text))
            if seen[-1].get("event") == "ready":
                break
        assert seen and seen[-1].get("event") == "ready", (seen, proc.poll())
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    ready = seen[-1]
    assert ready["bashNetwork"] is flag, ready
    assert ("allowNetwork" in ready["bash"]) is (flag and STATUS.available), ready
