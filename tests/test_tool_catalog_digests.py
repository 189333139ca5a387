"""The tool-catalog gate compares argument-schema digests, not only names.

Each run's user event records the catalog it started with (``stateDelta.makaToolCatalog``: name ->
schema digest). A continuation whose history called a tool that the host serves under another
schema parks ``tool_catalog_mismatch``, naming the tool and both digests.

- A real fleet: a ``maka worker`` serving ``tests.user_tools_pkg.effects`` runs ``charge`` and is
  SIGKILLed at P7; its execution is terminated; ``maka resume`` run with the next release of the
  module (``effects_v2``: ``charge`` now takes a currency) parks. Negative control: the same ledger
  planned with today's names-only observation continues (the name is still served).
- In process: unchanged digests continue; a run recorded before catalogs existed is judged by
  name alone; a host that gives no digests is judged by name alone.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from maka_core.ledger.continuation import CATALOG_KEY, SafetyObservation, _changed_schemas
from maka_core.runtime.continuation import plan_for
from maka_core.runtime.inspect import HostObservation, inspect_host
from maka_core.store.writer import LedgerStore
from maka_core.tools import tool_catalog
from maka_core.tools.loader import load_tools, with_tools
from maka_core.tools.registry import default_tools
from maka_temporal.workflows.contracts import workflow_id_for
from tests.temporal_support import WorkerProcess, run_maka, start, tool_step, write_script

V1, V2 = "tests.user_tools_pkg.effects", "tests.user_tools_pkg.effects_v2"


def _catalog(module: str) -> dict[str, str]:
    return tool_catalog(with_tools(default_tools(), load_tools([module], default_tools())))


def _host(ws: Path, catalog: dict[str, str] | list[str]) -> HostObservation:
    observed = inspect_host(str(ws), catalog)
    assert isinstance(observed, HostObservation), observed
    return observed


@pytest.mark.temporal
@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="session")
async def test_a_fleet_whose_tool_schema_changed_parks_and_names_only_would_continue(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    script = write_script(tmp_path / "s.json", [tool_step(("charge", {"amount": 7})), {"text": "ok"}])
    with WorkerProcess(
        temporal_server, db, task_queue, home=tmp_path, failpoint="P7", extra_env={"MAKA_TOOLS": V1}
    ) as doomed:
        doomed.wait_ready()
        session_id, _ = await start(temporal_client, ws_dir, script, task_queue)
        assert await doomed.wait_exit() == -9, f"no death at P7: {doomed.log.read_text()[-2000:]}"
    await temporal_client.get_workflow_handle(workflow_id_for(session_id)).terminate("execution lost")
    assert (ws_dir / "provider" / "charges.log").is_file()  # charge ran and its result committed

    with LedgerStore.open(db) as store:
        events = store.events(session_id=session_id)
    recorded = [
        e.actions.state_delta[CATALOG_KEY]
        for e in events
        if e.actions is not None and e.actions.state_delta and CATALOG_KEY in e.actions.state_delta
    ]
    assert recorded == [_catalog(V1)], recorded  # the run's catalog, from the worker that began it

    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MAKA_FAILPOINT")},
        "MAKA_HOME": str(tmp_path),
        "MAKA_DB": str(db),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "MAKA_TASK_QUEUE": task_queue,
        "MAKA_TOOLS": V2,
    }
    resumed = run_maka("resume", session_id, "--json", env=env)
    out = json.loads(resumed.stdout)
    assert resumed.returncode == 1 and out["decision"] == "park", resumed.stdout + resumed.stderr
    assert out["rejectionReasons"] == ["tool_catalog_mismatch"], out
    (diag,) = [d for d in out["diagnostics"] if d["code"] == "tool_catalog_mismatch"]
    assert diag["detail"] == {
        "changedToolSchemas": [
            {
                "toolName": "charge",
                "recordedDigest": _catalog(V1)["charge"],
                "currentDigest": _catalog(V2)["charge"],
            }
        ]
    }, diag

    # Negative control: the same ledger (the lost run settled by that resume), planned with the
    # names-only observation the gate had before (the name ``charge`` is served), continues.
    with LedgerStore.open(db) as store:
        run_id = next(r.run_id for r in store.list_runs(session_id))
        names_only = plan_for(store, session_id, run_id, _host(ws_dir, list(_catalog(V2))), lambda: "x")
        with_digests = plan_for(store, session_id, run_id, _host(ws_dir, _catalog(V2)), lambda: "x")
        same = plan_for(store, session_id, run_id, _host(ws_dir, _catalog(V1)), lambda: "x")
    assert names_only.disposition == "continue", names_only.to_json()
    assert with_digests.rejection_reasons == ("tool_catalog_mismatch",), with_digests.to_json()
    assert same.disposition == "continue", same.to_json()  # the fleet that ran it continues


def _call(name: str) -> dict[str, Any]:
    return {"content": {"kind": "function_call", "name": name, "id": str(uuid.uuid4()), "args": {}}}


def _user(catalog: dict[str, str] | None) -> dict[str, Any]:
    event: dict[str, Any] = {"content": {"kind": "text", "text": "go"}}
    if catalog is not None:
        event["actions"] = {"stateDelta": {CATALOG_KEY: catalog}}
    return event


def test_each_call_is_judged_by_its_runs_catalog_and_an_old_run_by_name() -> None:
    old, new = {"charge": "sha256:a"}, {"charge": "sha256:b"}
    # Run 1 recorded no catalog (written before they were recorded): name only.
    assert _changed_schemas([_user(None), _call("charge")], new) == []
    # Run 1 recorded ``old``; a continuation run (no user event) keeps its source's catalog.
    context = [_user(old), _call("charge"), _call("charge")]
    assert _changed_schemas(context, new) == [
        {"toolName": "charge", "recordedDigest": "sha256:a", "currentDigest": "sha256:b"}
    ]
    assert _changed_schemas(context, old) == []
    # A later run recorded ``new`` and called it again: the latest call decides.
    assert _changed_schemas([*context, _user(new), _call("charge")], new) == []
    # A host that gives no digests: names only, as the gate always did.
    assert _changed_schemas(context, None) == []
    # A tool the host does not serve is the names check's to report, not this one's.
    assert _changed_schemas(context, {}) == []


def test_the_observation_carries_digests_only_when_given() -> None:
    assert SafetyObservation("/", "a", "a", True).available_tool_digests is None
