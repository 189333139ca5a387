"""``maka worker --tools MODULE[:ATTR]`` / ``MAKA_TOOLS``: the worker's own tools, each bad entry
refused ``tools_invalid`` naming it with exit 2 before anything is opened or polled (nothing
listens at the Temporal address these runs are given: a worker that got as far as connecting would
say ``temporal_unavailable``, and none creates its ledger). And the loaded catalog: names and
argument-schema digests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from maka_core.tools import tool_catalog
from maka_core.tools.contract import ToolsInvalid, schema_digest
from maka_core.tools.loader import load_tools, with_tools
from maka_core.tools.registry import default_tools
from maka_temporal.workers.cli.app import maka
from maka_temporal.workers.host.devserver import free_port
from tests.user_tools_pkg import effects

PKG = "tests.user_tools_pkg"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str | None]:
    return {
        "MAKA_HOME": str(tmp_path / "home"),
        "TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",
        "MAKA_DB": None,
        "MAKA_TOOLS": None,
        "MAKA_TASK_QUEUE": None,
        "MAKA_POLICY": None,
    }


def worker(env: dict[str, str | None], *args: str) -> Result:
    return CliRunner().invoke(maka, ["worker", "--json", *args], env=env, catch_exceptions=False)


def refused(result: Result) -> dict[str, Any]:
    assert result.exit_code == 2, result.output
    body: dict[str, Any] = json.loads(result.stdout)
    assert body["ok"] is False and body["code"] == "tools_invalid", body
    assert "Traceback" not in result.output
    return body


def test_a_module_gives_every_tool_at_its_top_level() -> None:
    names = [t.name for t in load_tools([f"{PKG}.effects"], default_tools())]
    assert names == ["lookup", "charge", "notify", "append_entry", "put_note"]


def test_module_attr_gives_one_tool_or_a_list() -> None:
    assert [t.name for t in load_tools([f"{PKG}.effects:charge"])] == ["charge"]
    assert [t.name for t in load_tools([f"{PKG}.clash:ONLY_SECOND"])] == ["lookup"]


@pytest.mark.parametrize(
    ("entries", "words", "detail"),
    [
        ([f"{PKG}.missing"], "does not import", {"entry": f"{PKG}.missing"}),
        ([f"{PKG}.broken"], "broken on purpose", {"entry": f"{PKG}.broken"}),
        ([f"{PKG}.effects:nothing"], "has no attribute", {"entry": f"{PKG}.effects:nothing"}),
        ([f"{PKG}.clash:NOT_A_TOOL"], "is not a tool", {"entry": f"{PKG}.clash:NOT_A_TOOL"}),
        ([f"{PKG}.clash:not_bash"], "clashes with a built-in", {"tool": "bash"}),
        ([f"{PKG}.effects", f"{PKG}.clash:ONLY_SECOND"], "two tools are named", {"tool": "lookup"}),
        ([f"{PKG}.unguarded"], "must declare guarantee=", {"tool": "delete_everything"}),
        ([f"{PKG}"], "defines no tool", {"entry": PKG}),
    ],
)
def test_every_bad_entry_is_tools_invalid_naming_it(
    env: dict[str, str | None], entries: list[str], words: str, detail: dict[str, str]
) -> None:
    with pytest.raises(ToolsInvalid) as caught:
        load_tools(entries, default_tools())
    assert words in caught.value.message and detail.items() <= caught.value.detail.items()
    args = [a for e in entries for a in ("--tools", e)]
    body = refused(worker(env, *args))
    assert words in body["message"] and detail.items() <= body.items()
    assert not (Path(str(env["MAKA_HOME"])) / "ledger.sqlite").exists()  # refused before the ledger


def test_maka_tools_is_comma_separated_and_refused_alike(env: dict[str, str | None]) -> None:
    env["MAKA_TOOLS"] = f"{PKG}.effects:lookup, {PKG}.clash:ONLY_SECOND"
    assert "two tools are named" in refused(worker(env))["message"]


def test_good_tools_get_past_loading(env: dict[str, str | None]) -> None:
    # The control: the same command with good entries goes on to connect (and finds no Temporal).
    env["MAKA_TOOLS"] = f"{PKG}.effects:lookup"
    result = worker(env, "--tools", f"{PKG}.effects:charge")
    assert result.exit_code == 2
    assert json.loads(result.stdout)["code"] == "temporal_unavailable", result.output


def test_python_callers_pass_tools_where_the_runtime_is_built() -> None:
    catalog = with_tools(default_tools(), [effects.lookup])
    assert catalog["lookup"] is effects.lookup
    with pytest.raises(ToolsInvalid, match="clashes with a built-in"):
        with_tools(default_tools(), [load_tools([f"{PKG}.clash:not_bash"], ())[0]])


def test_the_catalog_is_names_and_argument_schema_digests() -> None:
    catalog = tool_catalog(with_tools(default_tools(), [effects.lookup]))
    assert catalog["lookup"] == schema_digest(effects.Key.model_json_schema())
    assert set(catalog) == {*default_tools(), "lookup"}


def test_maka_dev_checks_its_workers_tools_before_the_server_starts(env: dict[str, str | None]) -> None:
    result = CliRunner().invoke(
        maka, ["dev", "--json", "--tools", f"{PKG}.broken"], env=env, catch_exceptions=False
    )
    body = refused(result)
    assert body["entry"] == f"{PKG}.broken"
    assert "server" not in result.stdout.split("\n", 1)[0]  # refused before the dev server started
