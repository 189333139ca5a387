"""The CLI's bad-input edges, in process (Click's runner): every refusal is exit 2 with a stable code,
before anything is started or written, and never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from maka_core.store.writer import LedgerStore
from maka_temporal.workers.cli.app import maka
from maka_temporal.workers.host.devserver import free_port
from tests.temporal_support import REPO, tool_step, write_script

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "maka_examples").glob("*.jsonl"))


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str | None]:
    # Nothing listens at this address: a command that reached Temporal would say temporal_unavailable.
    return {
        "MAKA_HOME": str(tmp_path / "home"),
        "TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",
        "MAKA_TOOL_HEARTBEAT_TIMEOUT": None,
        "MAKA_DB": None,
        "MAKA_TASK_QUEUE": None,
        "MAKA_POLICY": None,
    }


def run(env: dict[str, str | None], *args: str | Path) -> Result:
    return CliRunner().invoke(maka, [str(a) for a in args], env=env, catch_exceptions=False)


def refused(result: Result, code: str) -> dict[str, Any]:
    assert result.exit_code == 2, result.output
    body: dict[str, Any] = json.loads(result.stdout)
    assert body["ok"] is False and body["code"] == code, body
    assert "Traceback" not in result.output
    return body


# --- settings ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["-5", "abc", "0"])
def test_a_bad_heartbeat_timeout_in_the_environment_is_config_invalid(
    env: dict[str, str | None], value: str
) -> None:
    env["MAKA_TOOL_HEARTBEAT_TIMEOUT"] = value
    body = refused(run(env, "worker", "--json"), "config_invalid")
    assert (
        body["setting"] == "MAKA_TOOL_HEARTBEAT_TIMEOUT" and "MAKA_TOOL_HEARTBEAT_TIMEOUT" in body["message"]
    )


def test_a_bad_heartbeat_flag_names_the_flag(env: dict[str, str | None]) -> None:
    body = refused(run(env, "worker", "--json", "--tool-heartbeat-timeout", "-5"), "config_invalid")
    assert body["source"] == "--tool-heartbeat-timeout"


@pytest.mark.parametrize("value", ["70000", "-1", "nine"])
def test_a_bad_metrics_port_in_the_environment_is_config_invalid(
    env: dict[str, str | None], value: str
) -> None:
    # MAKA_METRICS_PORT is a field of the one settings model, refused like every other setting.
    env["MAKA_METRICS_PORT"] = value
    body = refused(run(env, "worker", "--json"), "config_invalid")
    assert body["setting"] == "MAKA_METRICS_PORT", body


@pytest.mark.parametrize(
    "setting",
    [
        "MAKA_HOST_WAIT",
        "MAKA_TOOL_START_TO_CLOSE_TIMEOUT",
        "MAKA_WAIT_TIMEOUT",
        "MAKA_STICKY_TIMEOUT",
        "MAKA_WORKFLOW_TASK_TIMEOUT",
    ],
)
def test_every_documented_seconds_setting_refuses_a_bad_value_by_name(
    env: dict[str, str | None], setting: str
) -> None:
    for value in ("0", "-5", "abc"):
        env[setting] = value
        body = refused(run(env, "worker", "--json"), "config_invalid")
        assert body["setting"] == setting, body


def test_human_refusals_go_to_stderr(env: dict[str, str | None]) -> None:
    env["MAKA_TOOL_HEARTBEAT_TIMEOUT"] = "abc"
    result = run(env, "worker")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("error: config_invalid: MAKA_TOOL_HEARTBEAT_TIMEOUT")


def test_settings_model_reads_the_environment_and_flags_win(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from maka_core.errors import ConfigError
    from maka_core.settings import load_settings

    monkeypatch.setenv("MAKA_HOME", str(tmp_path))
    monkeypatch.setenv("MAKA_TASK_QUEUE", "q-env")
    monkeypatch.setenv("MAKA_TOOL_HEARTBEAT_TIMEOUT", "2.5")
    s = load_settings(task_queue=None)
    assert (s.home, s.task_queue, s.tool_heartbeat_timeout) == (tmp_path, "q-env", 2.5)
    assert s.ledger == tmp_path / "ledger.sqlite"
    assert (
        load_settings(task_queue="q-flag", db="postgresql+psycopg://h/db").ledger
        == "postgresql+psycopg://h/db"
    )
    assert load_settings(task_queue="q-flag").task_queue == "q-flag"
    monkeypatch.setenv("MAKA_POLICY", "{not json")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.code == "config_invalid" and info.value.detail["setting"] == "MAKA_POLICY"


def test_dev_refuses_a_port_out_of_range(env: dict[str, str | None]) -> None:
    body = refused(run(env, "dev", "--json", "--port", "99999"), "config_invalid")
    assert "--port" in body["message"]
    assert not (Path(env["MAKA_HOME"]) / "temporal.db").exists()


def test_devserver_start_refuses_a_port_out_of_range() -> None:
    from maka_core.errors import ConfigError
    from maka_temporal.workers.host import devserver

    with pytest.raises(ConfigError) as info:
        devserver.start(port=99999)
    assert info.value.code == "config_invalid"


def test_usage_errors_are_refusals(env: dict[str, str | None]) -> None:
    refused(run(env, "session", "status", "--json"), "usage_invalid")  # SESSION missing
    # An unknown option stops Click before --json's own callback: the refusal is JSON all the same.
    refused(run(env, "session", "status", "s", "--json", "--bogus"), "usage_invalid")
    refused(run(env, "ledger", "plan", "--json", "--bogus"), "usage_invalid")
    human = run(env, "ledger", "export")
    assert human.exit_code == 2 and "error: usage_invalid:" in human.stderr


# --- session start / send: validated before anything starts ----------------------------------


def _bad_scripts(tmp_path: Path) -> dict[str, Path]:
    files = {
        "bad-json": b'{"steps": [',
        "nan": b'{"steps": [{"text": NaN}]}',
        "duplicate-keys": b'{"steps": [], "steps": []}',
        "deep": b'{"steps": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}",
        "not-utf8": b'{"steps": [{"text": "\xff\xfe"}]}',
        "not-a-script": b'{"steps": "no"}',
    }
    out = {}
    for name, data in files.items():
        path = tmp_path / f"{name}.json"
        path.write_bytes(data)
        out[name] = path
    out["missing"] = tmp_path / "missing.json"
    return out


@pytest.mark.parametrize(
    "kind", ["bad-json", "nan", "duplicate-keys", "deep", "not-utf8", "not-a-script", "missing"]
)
def test_a_malformed_script_is_refused_before_anything_starts(
    env: dict[str, str | None], tmp_path: Path, ws_dir: Path, kind: str
) -> None:
    script = _bad_scripts(tmp_path)[kind]
    refused(
        run(env, "session", "start", "--json", "--workspace", ws_dir, "--script", script, "hi"),
        "script_invalid",
    )
    assert not (ws_dir / ".maka-workspace.json").exists()  # not even the workspace marker
    assert not Path(env["MAKA_HOME"]).exists()


@pytest.mark.parametrize(
    ("message", "code"), [("", "empty_message"), ("  \n\t", "empty_message"), ("a\udcff", "message_invalid")]
)
def test_a_bad_message_is_refused_before_anything_starts(
    env: dict[str, str | None], tmp_path: Path, ws_dir: Path, message: str, code: str
) -> None:
    script = write_script(tmp_path / "s.json", [{"text": "ok"}])
    refused(run(env, "session", "start", "--json", "--workspace", ws_dir, "--script", script, message), code)
    refused(run(env, "session", "send", "--json", "sess-x", message), code)
    assert not (ws_dir / ".maka-workspace.json").exists()


@pytest.mark.parametrize("session_id", ["", "a b", "x\ny", "../up", "-dash", "é", "x" * 201])
def test_a_bad_session_id_is_refused_before_anything_starts(
    env: dict[str, str | None], tmp_path: Path, ws_dir: Path, session_id: str
) -> None:
    script = write_script(tmp_path / "s.json", [{"text": "ok"}])
    args = ("session", "start", "--json", "--workspace", ws_dir, "--script", script)
    refused(run(env, *args, "--session-id", session_id, "hi"), "session_id_invalid")
    assert not (ws_dir / ".maka-workspace.json").exists() and not Path(env["MAKA_HOME"]).exists()
    # Negative control: a well-formed id gets past validation and reaches (the absent) Temporal.
    refused(run(env, *args, "--session-id", "sess-1.a_b:c@d", "hi"), "temporal_unavailable")


def test_valid_input_reaches_temporal(env: dict[str, str | None], tmp_path: Path, ws_dir: Path) -> None:
    """Negative control for the two tests above: good input gets as far as the (absent) server."""
    script = write_script(tmp_path / "s.json", [tool_step(("list_dir", {"path": "."})), {"text": "ok"}])
    refused(
        run(env, "session", "start", "--json", "--workspace", ws_dir, "--script", script, "hi"),
        "temporal_unavailable",
    )
    refused(run(env, "session", "send", "--json", "sess-x", "hi"), "temporal_unavailable")


def test_an_invalid_utf8_argument_from_a_real_shell(tmp_path: Path) -> None:
    environ = {**os.environ, "MAKA_HOME": str(tmp_path), "TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}"}
    proc = subprocess.run(
        [sys.executable, "-m", "maka_temporal", "session", "send", "--json", "sess-x", b"caf\xe9"],
        cwd=REPO,
        env=environ,
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 2 and json.loads(proc.stdout)["code"] == "message_invalid"


# --- the ledger as --db ------------------------------------------------------------------------


def test_show_refuses_a_directory_a_foreign_file_and_a_missing_ledger(
    env: dict[str, str | None], tmp_path: Path
) -> None:
    refused(run(env, "session", "show", "--json", "--db", tmp_path, "s"), "store_unreadable")
    foreign = tmp_path / "notes.txt"
    foreign.write_text("not a database, just some text that is long enough to have a header\n" * 20)
    before = foreign.read_bytes()
    refused(run(env, "session", "show", "--json", "--db", foreign, "s"), "store_unreadable")
    assert foreign.read_bytes() == before
    missing = tmp_path / "nope.sqlite"
    refused(run(env, "session", "show", "--json", "--db", missing, "s"), "ledger_not_found")
    refused(run(env, "session", "show", "--json", "s"), "ledger_not_found")  # the default under MAKA_HOME
    refused(run(env, "ledger", "verify", "--json", "--db", missing), "ledger_not_found")
    refused(run(env, "ledger", "export", "--json", "--db", missing, "--session", "s"), "ledger_not_found")
    assert not missing.exists() and not Path(env["MAKA_HOME"]).exists()


def test_status_of_an_unknown_session_or_ledger_is_one_refusal_and_nothing_else(
    env: dict[str, str | None], tmp_path: Path
) -> None:
    # No server answers (env): before the ledger is read, nothing may claim the state comes from it.
    missing = run(env, "session", "status", "s")
    assert (
        missing.exit_code == 2
        and missing.stderr == f"error: ledger_not_found: no ledger at {tmp_path}/home/ledger.sqlite\n"
    )
    db = tmp_path / "ledger.sqlite"
    LedgerStore.open(db).close()
    unknown = run(env, "session", "status", "s", "--db", db)
    assert unknown.exit_code == 2 and unknown.stderr == "error: session_not_found: no session s\n"


def test_session_cancel_takes_db_as_its_siblings_do(env: dict[str, str | None], tmp_path: Path) -> None:
    # Issue 32.3: `maka session cancel --db` was a usage error while send/status/resolve take it.
    # No server answers (env): the cancel gets as far as Temporal and says so.
    db = tmp_path / "ledger.sqlite"
    LedgerStore.open(db).close()
    for sibling in ("send", "status", "resolve", "cancel"):
        assert "--db" in run(env, "session", sibling, "--help").stdout, sibling
    refused(run(env, "session", "cancel", "s", "--db", db, "--json"), "temporal_unavailable")
    # Negative control: an option no session command takes is still the usage refusal.
    refused(run(env, "session", "cancel", "s", "--ledger", db, "--json"), "usage_invalid")


def test_ledger_accepts_a_sqlalchemy_url_and_export_refuses_an_unknown_session(
    env: dict[str, str | None], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    imported = run(env, "ledger", "import", "--db", url, FIXTURES[0], "--json")
    assert imported.exit_code == 0, imported.output
    exported = run(env, "ledger", "export", "--db", url, "--session", "sess-1")
    assert exported.exit_code == 0 and exported.stdout == FIXTURES[0].read_text()
    refused(run(env, "ledger", "export", "--json", "--db", url, "--session", "nope"), "session_not_found")
    human = run(env, "ledger", "export", "--db", url, "--session", "nope")
    assert human.exit_code == 2 and human.stderr.startswith("error: session_not_found:")
    refused(run(env, "ledger", "plan", "--json", "--db", url, "--session", "nope"), "session_not_found")
    shown = run(env, "session", "show", "--db", url, "sess-1")
    assert shown.exit_code == 0 and "user:" in shown.stdout


def test_import_of_a_huge_bad_file_caps_the_errors_it_reports(
    env: dict[str, str | None], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.jsonl"
    good = FIXTURES[0].read_text().splitlines()[0]
    with open(bad, "w") as fh:
        fh.write(good + "\n")
        for _ in range(20_000):
            fh.write('{"torn": \n')
    body = refused(run(env, "ledger", "import", "--db", tmp_path / "l.sqlite", bad), "json_syntax")
    assert body["line"] == 2 and body["errorCount"] == 20_000 and body["errorsTruncated"] is True
    assert len(body["errors"]) == 100 and body["errors"][-1]["line"] == 101
    assert not (tmp_path / "l.sqlite").exists()


def test_streamed_reader_agrees_with_parse_jsonl(tmp_path: Path) -> None:
    from maka_core.store.jsonl import parse_jsonl
    from maka_temporal.workers.cli.ledger import read_jsonl_streamed

    lines = FIXTURES[0].read_bytes().splitlines()
    data = lines[0] + b"\r\n\n" + lines[1][:-3] + b"\n" + b"\n".join(lines[2:]) + b"\n \n\n"
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    _, want = parse_jsonl(data)
    events, errors, bad = read_jsonl_streamed(path)
    assert [(e["line"], e["code"]) for e in errors] == [(e["line"], e["code"]) for e in want] and bad == 2
    assert events == []  # a refused file keeps nothing
    path.write_bytes(FIXTURES[0].read_bytes() + b"\n\n")
    events, errors, _ = read_jsonl_streamed(path)
    assert errors == [] and events == parse_jsonl(FIXTURES[0].read_bytes())[0]


# --- pipes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["status", "show", "export"])
def test_a_closed_pipe_is_not_a_traceback(tmp_path: Path, command: str) -> None:
    db = tmp_path / "l.sqlite"
    environ = {**os.environ, "MAKA_HOME": str(tmp_path), "TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}"}
    maka = [sys.executable, "-m", "maka_temporal"]
    subprocess.run(
        [*maka, "ledger", "import", "--db", str(db), str(FIXTURES[0])], cwd=REPO, env=environ, check=True
    )
    args = {
        "status": ["session", "status", "--db", str(db), "sess-1"],
        "show": ["session", "show", "--db", str(db), "sess-1"],
        "export": ["ledger", "export", "--db", str(db), "--session", "sess-1"],
    }[command]
    # `maka ... | head -0`: the reader is gone before maka writes a byte.
    proc = subprocess.Popen(
        [*maka, *args], cwd=REPO, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 0, err
    assert "BrokenPipeError" not in err and "Traceback" not in err


def test_session_start_refuses_a_workspace_that_holds_the_ledger_before_anything_starts(
    tmp_path: Path, env: dict[str, str | None]
) -> None:
    """`--workspace ~`-style mistakes: a folder containing MAKA_HOME (and so the default ledger) is
    never a workspace, and nothing is started or written."""
    script = tmp_path / "script.json"
    script.write_text('{"steps": [{"text": "hi"}]}')
    refused(
        run(env, "session", "start", "--workspace", tmp_path, "--script", script, "--json", "hello"),
        "workspace_contains_ledger",
    )
    assert not (tmp_path / ".maka-workspace.json").exists()
