"""Flags the README documents, given on the command line of a real ``maka`` process against the test
session's dev server: ``session start --principal/--on-behalf-of`` (recorded in the session policy
and in every receipt's principal chain), ``--model-step-mode activity`` (the model step becomes a
scheduled activity) and ``local`` (every step a local activity; the default ``with_tool`` runs only a
turn's first step that way and the others in the previous call's tool activity), ``--namespace``
(the workflow lands in that namespace, not ``default``),
``maka worker --unsafe-no-sandbox`` (the ready event says so) and ``maka dev --ui-port``. Each has
its negative control in the same test: the same command without the flag."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from maka_core.store.writer import LedgerStore
from maka_temporal.workers.host.devserver import free_port
from maka_temporal.workflows.contracts import MODEL_STEP, workflow_id_for
from tests.temporal_support import REPO, WorkerProcess, tool_step, write_script
from tests.temporal_support import run_maka as maka

pytestmark = pytest.mark.temporal


def stop(proc: subprocess.Popen[Any], *, grace: float) -> None:
    """SIGTERM (the process shuts down as an operator's Ctrl-C would), SIGKILL past ``grace``."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _env(home: Path, address: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "MAKA_HOME": str(home),
            "TEMPORAL_ADDRESS": address,
            "MAKA_TASK_QUEUE": f"flags-{uuid.uuid4().hex[:10]}",
        }
    )
    for key in ("MAKA_DB", "MAKA_POLICY", "TEMPORAL_NAMESPACE", "MAKA_WAIT_TIMEOUT"):
        env.pop(key, None)
    env.update(extra)
    return env


async def _history_kinds(address: str, session_id: str) -> tuple[list[str], int, int]:
    """(activity types scheduled, local-activity markers, activity results that carry a model
    step) of the session's workflow history."""
    from temporalio.api.enums.v1 import EventType

    from maka_temporal.workers.client.connect import connect

    client = await connect(address)
    history = await client.get_workflow_handle(workflow_id_for(session_id)).fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    markers = sum(1 for e in history.events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED)
    carrying = sum(
        1
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        and any(
            "next_step" in json.loads(p.data)
            for p in e.activity_task_completed_event_attributes.result.payloads
        )
    )
    return scheduled, markers, carrying


def test_principal_on_behalf_of_and_model_step_mode_flags_reach_the_ledger_and_the_history(
    temporal_server: Any, tmp_path: Path, ws_dir: Path
) -> None:
    home = tmp_path / "home"
    env = _env(home, temporal_server.address)
    db = home / "ledger.sqlite"
    script = write_script(
        tmp_path / "s.json", [tool_step(("write_file", {"path": "f.txt", "content": "hi\n"})), {"text": "ok"}]
    )
    flagged = [
        "--principal", "human:alice", "--on-behalf-of", "organization:acme", "--on-behalf-of", "human:bob",
        "--model-step-mode", "activity",
    ]  # fmt: skip
    sessions = {}
    with WorkerProcess(temporal_server, db, env["MAKA_TASK_QUEUE"], home=home) as worker:
        worker.wait_ready()
        runs = (("flagged", flagged), ("plain", []), ("local", ["--model-step-mode", "local"]))
        for name, extra in runs:
            out = maka(
                "session", "start", "--workspace", str(ws_dir), "--script", str(script), "--session-id",
                # The step modes' shapes in history, with the write a regular activity (not hybrid).
                f"{name}-{uuid.uuid4().hex[:8]}", *extra, "--tool-mode", "activity", "--wait", "--json", "go",
                env=env,
            )  # fmt: skip
            assert out.returncode == 0, (out.stdout, out.stderr)
            body = json.loads(out.stdout)
            assert body["state"] == "idle", body
            sessions[name] = body["sessionId"]
    with LedgerStore.open(db) as store:
        identity = {k: store.session_policy(sid)["identity"] for k, sid in sessions.items()}  # type: ignore[index]
        chains = {k: [r["principal"] for r in store.receipts(sid) if r["kind"] == "action_receipt"]
                  for k, sid in sessions.items()}  # fmt: skip
    assert identity["flagged"]["principal"] == {"kind": "human", "id": "alice"}, identity
    assert [p["id"] for p in identity["flagged"]["onBehalfOf"]] == ["acme", "bob"], identity
    assert chains["flagged"] == ["organization:acme/human:bob/human:alice"]
    # Negative control: without the flags the session acts as the built-in agent:local.
    assert identity["plain"]["principal"] == {"kind": "agent", "id": "local"}, identity
    assert chains["plain"] == ["agent:local"]
    kinds = {
        name: asyncio.run(_history_kinds(temporal_server.address, sid)) for name, sid in sessions.items()
    }
    activity, activity_markers, activity_carried = kinds["flagged"]
    local, local_markers, local_carried = kinds["local"]
    default, default_markers, default_carried = kinds["plain"]
    assert activity.count(MODEL_STEP) == 2 and activity_carried == 0, kinds  # each a scheduled activity
    assert MODEL_STEP not in local and local_markers >= 2 + activity_markers and local_carried == 0, kinds
    # The default: the first step is a local activity, the second rides back with the write.
    assert MODEL_STEP not in default and default_markers == 1 + activity_markers, kinds
    assert default_carried == 1, kinds


async def _namespace_ready(address: str, namespace: str) -> None:
    """Register ``namespace`` on the dev server and wait until its frontend serves it."""
    from datetime import timedelta

    from google.protobuf.duration_pb2 import Duration
    from temporalio.api.workflowservice.v1 import ListWorkflowExecutionsRequest, RegisterNamespaceRequest

    from maka_temporal.workers.client.connect import connect

    client = await connect(address)
    retention = Duration()
    retention.FromTimedelta(timedelta(days=1))
    await client.workflow_service.register_namespace(
        RegisterNamespaceRequest(namespace=namespace, workflow_execution_retention_period=retention)
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            await client.workflow_service.list_workflow_executions(
                ListWorkflowExecutionsRequest(namespace=namespace)
            )
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def _add_search_attributes(address: str, namespace: str) -> None:
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest

    from maka_temporal.workers.client.connect import connect
    from maka_temporal.workers.host.devserver import SEARCH_ATTRIBUTES

    client = await connect(address)
    keyword = IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
    await client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace=namespace, search_attributes=dict.fromkeys(SEARCH_ATTRIBUTES, keyword)
        )
    )


async def _exists(address: str, namespace: str, session_id: str) -> bool:
    from temporalio.service import RPCError, RPCStatusCode

    from maka_temporal.workers.client.connect import connect

    client = await connect(address, namespace)
    try:
        await client.get_workflow_handle(workflow_id_for(session_id)).describe()
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        return False
    return True


def test_the_namespace_flag_reaches_the_client(temporal_server: Any, tmp_path: Path, ws_dir: Path) -> None:
    namespace = f"maka-flags-{uuid.uuid4().hex[:8]}"
    asyncio.run(_namespace_ready(temporal_server.address, namespace))
    # No worker polls: the start leaves its workflow and gives up waiting for one to accept it.
    env = _env(tmp_path / "home", temporal_server.address, MAKA_WAIT_TIMEOUT="2")
    script = write_script(tmp_path / "s.json", [{"text": "hi"}])

    def start(*extra: str) -> subprocess.CompletedProcess[str]:
        return maka(
            "session", "start", "--workspace", str(ws_dir), "--script", str(script), *extra, "--json", "hi",
            env=env,
        )  # fmt: skip

    # A namespace the server does not know, and one without maka's search attributes: refusals,
    # not tracebacks, and no policy left behind (the server created nothing).
    refused = f"refused-{uuid.uuid4().hex[:8]}"
    for ns, code in ((f"{namespace}-none", "namespace_not_found"), (namespace, "search_attributes_missing")):
        out = start("--namespace", ns, "--session-id", refused, "--principal", "human:alice")
        assert out.returncode == 2 and "Traceback" not in out.stderr, out
        assert json.loads(out.stdout)["code"] == code, out
        with LedgerStore.open(tmp_path / "home" / "ledger.sqlite") as store:
            assert store.session_policy(refused) is None, code
    asyncio.run(_add_search_attributes(temporal_server.address, namespace))
    # So the corrected start may name another principal (the row above would have refused it with
    # ``session_policy_conflict``); it starts, and no worker accepting it is this test's business.
    out = start("--namespace", namespace, "--session-id", refused, "--principal", "human:bob")
    assert json.loads(out.stdout)["code"] == "wait_timeout", out
    # Negative control: a refused start never takes the policy of a session that was started.
    out = start("--namespace", f"{namespace}-none", "--session-id", refused, "--principal", "human:bob")
    assert json.loads(out.stdout)["code"] == "namespace_not_found", out
    with LedgerStore.open(tmp_path / "home" / "ledger.sqlite") as store:
        kept = store.session_policy(refused)
    assert kept is not None and kept["identity"]["principal"]["id"] == "bob", kept
    placed = {}
    for where, extra in ((namespace, ["--namespace", namespace]), ("default", [])):
        sid = f"ns-{uuid.uuid4().hex[:8]}"
        out = start("--session-id", sid, *extra)
        assert out.returncode == 2 and json.loads(out.stdout)["code"] == "wait_timeout", out
        placed[where] = {
            ns: asyncio.run(_exists(temporal_server.address, ns, sid)) for ns in (namespace, "default")
        }
    assert placed[namespace] == {namespace: True, "default": False}, placed
    assert placed["default"] == {namespace: False, "default": True}, placed  # negative control


def _ready_event(args: list[str], env: dict[str, str], log: Path) -> dict[str, Any]:
    """Start ``maka worker ARGS --json``, read its ready event, stop it (SIGTERM to its own pid)."""
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "maka_temporal", "worker", "--no-repair", "--json", *args],
            cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for line in log.read_text().splitlines():
                if line.startswith("{") and json.loads(line).get("event") == "ready":
                    return json.loads(line)  # type: ignore[no-any-return]
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
        raise AssertionError(f"no ready event: {log.read_text()}")
    finally:
        stop(proc, grace=20)


def test_unsafe_no_sandbox_flag_is_said_by_the_ready_event_and_the_log(
    temporal_server: Any, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    env = _env(home, temporal_server.address)
    unsafe = _ready_event(["--unsafe-no-sandbox"], env, tmp_path / "unsafe.log")
    assert unsafe["unsafeNoSandbox"] is True, unsafe
    assert "WITHOUT a sandbox" in (tmp_path / "unsafe.log").read_text()
    env["MAKA_TASK_QUEUE"] += "-safe"
    safe = _ready_event([], env, tmp_path / "safe.log")  # negative control
    assert safe["unsafeNoSandbox"] is False, safe
    assert "WITHOUT a sandbox" not in (tmp_path / "safe.log").read_text()


def test_dev_serves_its_web_ui_on_the_ui_port_flag(tmp_path: Path) -> None:
    port, ui_port = free_port(), free_port()
    assert ui_port != port + 1000  # the default would not pass for the flag
    env = _env(tmp_path / "home", f"127.0.0.1:{port}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "maka_temporal", "dev", "--no-worker", "--json", "--port", str(port),
         "--ui-port", str(ui_port)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        event = json.loads(proc.stdout.readline())
        assert event["event"] == "server" and event["ui"] == f"http://127.0.0.1:{ui_port}", event
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/", timeout=2) as page:
                    assert page.status == 200
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.3)
    finally:
        stop(proc, grace=30)


def _dev_server_event(env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "maka_temporal", "dev", "--no-worker", "--json", *args],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, (proc.wait(30), proc.stderr.read() if proc.stderr else "")
        event: dict[str, Any] = json.loads(line)
        return event
    finally:
        stop(proc, grace=30)


def test_dev_binds_the_port_of_temporal_address_when_no_port_is_given(tmp_path: Path) -> None:
    # Issue 32.3: `maka dev --no-worker` with TEMPORAL_ADDRESS=127.0.0.1:7455 bound 7233, so every
    # client that read TEMPORAL_ADDRESS found no server. Without --port the port is TEMPORAL_ADDRESS's.
    port, other = free_port(), free_port()
    env = _env(tmp_path / "home", f"127.0.0.1:{port}")
    event = _dev_server_event(env)
    assert event["event"] == "server" and event["address"] == f"127.0.0.1:{port}", event
    # Negative control: an explicit --port still wins over TEMPORAL_ADDRESS.
    event = _dev_server_event(env, "--port", str(other))
    assert event["address"] == f"127.0.0.1:{other}", event


def test_dev_creates_the_namespace_its_worker_serves(tmp_path: Path) -> None:
    # `maka dev --namespace NS` connects its worker to NS, so the server it starts must create NS
    # (with maka's search attributes). Before, the server had only `default` and the worker refused.
    port = free_port()
    env = _env(tmp_path / "home", f"127.0.0.1:{port}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "maka_temporal", "dev", "--json", "--port", str(port),
         "--namespace", "team-a"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    seen: list[dict[str, Any]] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # ends at EOF if the process exits
            seen.append(json.loads(line))
            if seen[-1].get("event") == "ready":
                break
        assert seen and seen[-1].get("event") == "ready", (seen, proc.poll())

        async def attributes() -> list[str]:
            from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest

            from maka_temporal.workers.client.connect import connect

            client = await connect(f"127.0.0.1:{port}", "team-a")
            listed = await client.operator_service.list_search_attributes(
                ListSearchAttributesRequest(namespace="team-a")
            )
            return sorted(k for k in listed.custom_attributes if k.startswith("Maka"))

        assert asyncio.run(attributes()) == ["MakaParkReason", "MakaSessionId", "MakaState"]
    finally:
        stop(proc, grace=30)


async def test_the_sticky_timeout_comes_from_the_settings_model(
    temporal_client: Any, task_queue: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ``MAKA_STICKY_TIMEOUT`` is read through the one settings model (validated, documented), not
    # from the environment by the worker; an explicit option still wins, and unset is the SDK's 5 s.
    from datetime import timedelta

    from maka_core.errors import ConfigError
    from maka_core.runtime.runtime import Runtime
    from maka_temporal.activities import MakaActivities
    from maka_temporal.workers.host.worker import build_worker

    def sticky(**options: Any) -> Any:
        with LedgerStore.open(tmp_path / f"{uuid.uuid4().hex}.sqlite") as store:
            acts = MakaActivities(Runtime(store))
            try:
                # A queue each: the SDK refuses a second worker on a queue in one process.
                queue = f"{task_queue}-{uuid.uuid4().hex[:6]}"
                worker = build_worker(temporal_client, acts, queue, **options)
                return worker.config()["sticky_queue_schedule_to_start_timeout"]
            finally:
                acts.runtime.close()

    monkeypatch.delenv("MAKA_STICKY_TIMEOUT", raising=False)
    assert sticky() == timedelta(seconds=5)
    monkeypatch.setenv("MAKA_STICKY_TIMEOUT", "1.5")
    assert sticky() == timedelta(seconds=1.5)
    assert sticky(sticky_timeout=timedelta(seconds=3)) == timedelta(seconds=3)
    # Validated as every setting is: a bad value is refused by name before a worker exists (a
    # worker reading the variable itself took "-1" as a negative timeout).
    monkeypatch.setenv("MAKA_STICKY_TIMEOUT", "-1")
    with pytest.raises(ConfigError) as refused:
        sticky()
    assert refused.value.code == "config_invalid" and "MAKA_STICKY_TIMEOUT" in str(refused.value)
