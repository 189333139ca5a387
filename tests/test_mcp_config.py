"""The MCP servers file and the guarantee an MCP tool runs under.

Every bad file is ``mcp_config_invalid`` with the path of the offending field, and ``maka worker
--mcp-config`` refuses it (exit 2) before it opens a ledger or reaches Temporal. The guarantee comes
from the annotations in the issue's order only for a server the file trusts (``trustAnnotations``);
every other server's tools are ``at-most-once`` and possibly destructive mutations whatever they
say; hints that contradict each other are the worst case; the file narrows what it trusts and widens
only with ``operatorTrust``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from maka_core.errors import ConfigError
from maka_core.tools.mcp import (
    Annotations,
    StdioServer,
    annotated_guarantee,
    choose_guarantee,
    load_mcp_config,
    parse_mcp_config,
)
from maka_core.tools.mcp.guarantee import effects_of, widened_without_trust
from maka_temporal.workers.cli.app import maka
from maka_temporal.workers.host.devserver import free_port


def invalid(value: Any) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_mcp_config(value)
    assert caught.value.code == "mcp_config_invalid"
    return caught.value


def test_a_stdio_and_an_http_server_parse_and_a_relative_cwd_is_the_files() -> None:
    config = parse_mcp_config(
        {
            "mcpServers": {
                "notes": {"command": "python", "args": ["n.py"], "env": {"T": "secret-1"}, "cwd": "srv"},
                "search": {"type": "http", "url": "http://127.0.0.1:9/mcp", "headers": {"A": "b"}},
                "files": {"command": "fs", "args": ["${workspace}"], "scope": "session"},
            }
        },
        base=Path("/etc/maka"),
    )
    notes, search, files = (config.mcp_servers[n] for n in ("notes", "search", "files"))
    assert isinstance(notes, StdioServer) and notes.cwd == "/etc/maka/srv"
    assert "secret-1" not in repr(notes)  # env is a secret: no repr, no log line shows it
    assert not isinstance(search, StdioServer) and search.url == "http://127.0.0.1:9/mcp"
    assert isinstance(files, StdioServer) and files.args_for(Path("/w")) == ["/w"]


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"mcpServers": {"a": {"comand": "x"}}}, "mcpServers.a"),
        ({"mcpServers": {"a": {"command": "x", "comand": "y"}}}, "mcpServers.a.comand"),
        ({"mcpServers": {"a": {"args": ["x"]}}}, "mcpServers.a"),
        ({"mcpServers": {"a": {"command": "x", "url": "http://h/"}}}, "mcpServers.a.url"),
        ({"mcpServers": {"a": {"command": "x", "args": "y"}}}, "mcpServers.a.args"),
        ({"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}, "mcpServers.a.env.K"),
        ({"mcpServers": {"a": {"url": "ftp://h"}}}, "mcpServers.a.url"),
        ({"mcpServers": {"a": {"url": "http://h", "scope": "session"}}}, "mcpServers.a.scope"),
        ({"mcpServers": {"a": {"command": "x", "args": ["${workspace}"]}}}, "mcpServers.a"),
        ({"mcpServers": {"a": {"command": "x", "scope": "session", "cwd": "d"}}}, "mcpServers.a"),
        ({"mcpServers": {"a__b": {"command": "x"}}}, "mcpServers.a__b"),
        ({"mcpServers": {"a": {"command": "x", "guarantee": "twice"}}}, "mcpServers.a.guarantee"),
        (
            {"mcpServers": {"a": {"command": "x", "tools": {"t": {"guarantee": "reconciliation-required"}}}}},
            "mcpServers.a.tools.t.guarantee",
        ),
        (
            {"mcpServers": {"a": {"command": "x", "tools": {"t": {"guarantee": "read-only", "trust": 1}}}}},
            "mcpServers.a.tools.t.trust",
        ),
        ({"mcpServers": {}}, "mcpServers"),
        ({"servers": {}}, "mcpServers"),
        ([], "$"),
    ],
)
def test_a_bad_file_is_mcp_config_invalid_with_the_field_path(value: Any, field: str) -> None:
    error = invalid(value)
    assert error.detail["field"] == field, error.message
    assert field in error.message or field == "$"


def test_text_that_is_not_json_or_repeats_a_key_is_refused(tmp_path: Path) -> None:
    for text in ("{not json", '{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}}}'):
        path = tmp_path / "servers.json"
        path.write_text(text)
        with pytest.raises(ConfigError) as caught:
            load_mcp_config(path)
        assert caught.value.code == "mcp_config_invalid" and caught.value.detail["field"] == "$"
    with pytest.raises(ConfigError) as missing:
        load_mcp_config(tmp_path / "absent.json")
    assert missing.value.code == "mcp_config_invalid"


@pytest.mark.parametrize(
    ("hints", "expected"),
    [
        (None, "at-most-once"),
        (Annotations(), "at-most-once"),
        (Annotations(read_only=True), "read-only"),
        (Annotations(read_only=True, idempotent=False), "read-only"),
        (Annotations(idempotent=True), "provider-idempotent"),
        (Annotations(read_only=False, idempotent=True), "provider-idempotent"),
        (Annotations(read_only=False, idempotent=False), "at-most-once"),
        # Contradictory (issue 37.11): a read that says it destroys is the worst case.
        (Annotations(read_only=True, destructive=True), "at-most-once"),
        (Annotations(read_only=True, destructive=True, idempotent=True), "at-most-once"),
        (Annotations(read_only=True, destructive=False), "read-only"),
    ],
)
def test_annotations_give_the_guarantee_in_the_issues_order(hints: Annotations | None, expected: str) -> None:
    assert annotated_guarantee(hints) == expected


def _server(**fields: Any) -> StdioServer:
    return StdioServer.model_validate({"command": "x", **fields})


def test_the_file_narrows_and_widens_only_with_operator_trust() -> None:
    read = Annotations(read_only=True)
    idem = Annotations(idempotent=True)
    # A server's ceiling narrows every tool; a tool's own guarantee narrows that tool.
    capped = _server(guarantee="at-most-once", trustAnnotations=True)
    assert choose_guarantee(read, capped, "t").guarantee == "at-most-once"
    assert choose_guarantee(read, capped, "t").source == "narrowed"
    own = _server(tools={"t": {"guarantee": "provider-idempotent"}}, trustAnnotations=True)
    assert choose_guarantee(read, own, "t").guarantee == "provider-idempotent"
    assert choose_guarantee(read, own, "other").guarantee == "read-only"
    assert choose_guarantee(read, own, "other").source == "annotations_trusted"
    # Asking for more than the annotations give, without trust, changes nothing ...
    wider = _server(tools={"t": {"guarantee": "read-only"}}, trustAnnotations=True)
    assert choose_guarantee(idem, wider, "t").guarantee == "provider-idempotent"
    assert choose_guarantee(None, wider, "t").guarantee == "at-most-once"
    assert widened_without_trust(idem, wider, "t")
    # ... with it, the operator's word holds, and says so, on any server.
    for trust in (True, False):
        trusted = _server(
            guarantee="at-most-once",
            tools={"t": {"guarantee": "read-only", "operatorTrust": True}},
            trustAnnotations=trust,
        )
        chosen = choose_guarantee(None, trusted, "t")
        assert (chosen.guarantee, chosen.annotated, chosen.source, chosen.annotations_trusted) == (
            "read-only",
            "at-most-once",
            "operator_trust",
            trust,
        )


@pytest.mark.parametrize(
    "hints",
    [
        Annotations(read_only=True),
        Annotations(idempotent=True),
        Annotations(read_only=True, destructive=False),
    ],
    ids=["readOnlyHint", "idempotentHint", "readOnly-not-destructive"],
)
def test_an_untrusted_servers_annotations_are_recorded_and_never_acted_on(hints: Annotations) -> None:
    untrusted = _server()  # the default: no "trustAnnotations"
    chosen = choose_guarantee(hints, untrusted, "t")
    assert (chosen.guarantee, chosen.source, chosen.annotations_trusted) == (
        "at-most-once",
        "untrusted_default",
        False,
    )
    assert chosen.annotated == annotated_guarantee(hints)  # what they said, kept for the record
    assert effects_of(hints, chosen.guarantee, trusted=chosen.annotations_trusted) == (
        "mutate",
        "destructive",
    )
    # A file that narrows still narrows (nothing below at-most-once), and one that asks for more
    # than the default without operatorTrust is told it did not take effect.
    asks = _server(tools={"t": {"guarantee": "read-only"}})
    assert choose_guarantee(hints, asks, "t").guarantee == "at-most-once"
    assert widened_without_trust(hints, asks, "t")
    # The control: the same hints from a trusted server decide.
    trusted = choose_guarantee(hints, _server(trustAnnotations=True), "t")
    assert (trusted.guarantee, trusted.source) == (annotated_guarantee(hints), "annotations_trusted")


def test_trust_annotations_is_a_strict_boolean_per_server() -> None:
    config = parse_mcp_config(
        {"mcpServers": {"a": {"command": "x", "trustAnnotations": True}, "b": {"url": "http://h/"}}}
    )
    assert [s.trust_annotations for s in config.mcp_servers.values()] == [True, False]
    for bad in ("true", 1, None):
        error = invalid({"mcpServers": {"a": {"command": "x", "trustAnnotations": bad}}})
        assert error.detail["field"] == "mcpServers.a.trustAnnotations", error.message


def test_maka_worker_refuses_a_bad_mcp_config_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "servers.json"
    bad.write_text(json.dumps({"mcpServers": {"a": {"command": "x", "cwdd": "y"}}}))
    home = tmp_path / "home"
    env = {"MAKA_HOME": str(home), "TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}", "MAKA_MCP_CONFIG": None}
    for args, extra in (
        (["worker", "--json", "--mcp-config", str(bad)], {}),
        (["worker", "--json"], {"MAKA_MCP_CONFIG": str(bad)}),
        # ``maka dev`` takes the flag too, and refuses before its dev server starts.
        (["dev", "--json", "--mcp-config", str(bad)], {}),
    ):
        result = CliRunner().invoke(maka, args, env={**env, **extra}, catch_exceptions=False)
        assert result.exit_code == 2, result.output
        body = json.loads(result.stdout)
        assert body["code"] == "mcp_config_invalid" and body["field"] == "mcpServers.a.cwdd", body
        assert "Traceback" not in result.output
        assert not (home / "ledger.sqlite").exists()  # nothing written, Temporal never asked
        assert not (home / "temporal.db").exists()  # no dev server was started


def test_reading_the_settings_and_the_file_never_imports_the_sdk(tmp_path: Path) -> None:
    # Every maka command reads the settings (and so parses MAKA_MCP_CONFIG); only a worker talks
    # to servers, so only a worker pays for the SDK and its HTTP stack.
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"a": {"command": "x"}}}))
    probe = (
        "import sys; from maka_core.settings import load_settings; "
        f"load_settings(mcp_config={str(config)!r}).runtime_settings(); "
        "print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith(('mcp.', 'httpx2'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize(
    ("hints", "guarantee", "expected"),
    [
        (Annotations(read_only=True), "read-only", ("read",)),
        (None, "at-most-once", ("mutate", "destructive")),  # MCP: destructiveHint defaults to true
        (Annotations(idempotent=True), "provider-idempotent", ("mutate", "destructive")),
        (Annotations(idempotent=True, destructive=False), "provider-idempotent", ("mutate",)),
        (None, "read-only", ("read",)),  # an operator's trusted read is judged as a read
        # Contradictory: the destructive hint wins.
        (Annotations(read_only=True, destructive=True), "at-most-once", ("mutate", "destructive")),
    ],
)
def test_the_effects_policy_judges_follow_a_trusted_destructive_hint(
    hints: Annotations | None, guarantee: Any, expected: tuple[str, ...]
) -> None:
    assert effects_of(hints, guarantee, trusted=True) == expected
    # Untrusted, destructiveHint: false is only a claim: every non-read is possibly destructive.
    untrusted = ("read",) if guarantee == "read-only" else ("mutate", "destructive")
    assert effects_of(hints, guarantee) == untrusted


def test_a_contradictory_tool_of_a_trusted_server_is_the_worst_case() -> None:
    both = Annotations(read_only=True, destructive=True)
    chosen = choose_guarantee(both, _server(trustAnnotations=True), "t")
    assert (chosen.guarantee, chosen.annotated, chosen.source) == (
        "at-most-once",
        "at-most-once",
        "annotations_trusted",
    )
    assert effects_of(both, chosen.guarantee, trusted=True) == ("mutate", "destructive")
    assert both.to_json() == {"readOnlyHint": True, "destructiveHint": True}
