"""The built-in tools declare their arguments once, as a pydantic model: the provider-facing schema
is derived from it and stays exactly what providers have always been sent (frozen here), and the
model is the checker (``invalid_args`` for a missing, unexpected or mistyped argument)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from maka_core.facts import canonical_json
from maka_core.tools.registry import default_tools
from maka_core.workspace import Workspace

_PATH = {"type": "string", "description": "Path relative to the workspace root."}
#: The schemas as they were written by hand before the models (provider requests carry them).
FROZEN: dict[str, dict[str, Any]] = {
    "read_file": {
        "type": "object",
        "properties": {"path": _PATH},
        "required": ["path"],
        "additionalProperties": False,
    },
    "list_dir": {
        "type": "object",
        "properties": {"path": _PATH},
        "required": ["path"],
        "additionalProperties": False,
    },
    "write_file": {
        "type": "object",
        "properties": {"path": _PATH, "content": {"type": "string"}},
        "required": ["path", "content"],
        "additionalProperties": False,
    },
    "edit_file": {
        "type": "object",
        "properties": {
            "path": _PATH,
            "old_text": {"type": "string", "description": "Exact text to replace; must occur once."},
            "new_text": {"type": "string", "description": "Replacement text."},
        },
        "required": ["path", "old_text", "new_text"],
        "additionalProperties": False,
    },
    "bash": {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The bash command line."}},
        "required": ["command"],
        "additionalProperties": False,
    },
}


@pytest.mark.parametrize("name", sorted(FROZEN))
def test_the_derived_schema_is_the_one_providers_have_always_been_sent(name: str) -> None:
    derived = default_tools()[name].parameters
    assert derived == FROZEN[name]
    # Same keys in the same order: the bytes a provider request carries.
    assert list(derived) == list(FROZEN[name]) and list(derived["properties"]) == list(
        FROZEN[name]["properties"]
    )
    assert canonical_json.dumps(derived) == canonical_json.dumps(FROZEN[name])


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("read_file", {}),
        ("read_file", {"path": 3}),
        ("read_file", {"path": True}),
        ("list_dir", {"path": ".", "extra": 1}),
        ("write_file", {"path": "a"}),
        ("edit_file", {"path": "a", "old_text": "x", "new_text": None}),
        ("bash", {"command": ["ls"]}),
        ("bash", []),
    ],
)
def test_the_model_refuses_bad_arguments_invalid_args(tmp_path: Path, name: str, args: Any) -> None:
    (tmp_path / "ws").mkdir()
    ws = Workspace.open(tmp_path / "ws")
    result = default_tools()[name].preflight(args, ws)
    assert result is not None and result.error_code == "invalid_args", result
