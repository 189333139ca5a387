"""A provider that replays a JSON script: for tests, demos and crash drills.

Script format (a contract shared with the CLI and the drills)::

    {"steps": [ {"text": "..."} | {"toolCalls": [{"name": "write_file", "args": {...}}, ...]} ]}

A step may carry both ``text`` and ``toolCalls``, and an optional ``usage``: the token counts the
step reports as if a vendor had, in Maka's ``tokenUsage`` shape (``{"input": 30, "output": 10}``:
``input`` and ``output``, and any of ``total``, ``cacheRead``, ``cacheCreation``, ``reasoning``,
each an integer from 0 to ``facts.usage.MAX_STEP_COUNT``), committed with the step like a
vendor's usage. Without it a step reports none. Step k is returned on the session's k-th model
step (``step_index``, counted across the whole session, so a continuation resumes at the next
unused step); tool call ids are ``call-<k>-<i>``, deterministic so that a retried or replayed step
produces the same calls; past the end the script answers ``(script finished)``.

A string argument that is exactly ``{{result:<toolCallId>:<dotted.path>}}`` is replaced by the
value at that path in the committed JSON result of that earlier call (read from the history the
step is given, so a retried step resolves it the same way); it stays as written when the result
is not there; a text result (``{"kind": "text"}``, such as the note an operator's resolution
shows the model) has the one path ``text``. This is how a script passes an id it cannot know in
advance (``melra_plan``'s ``taskId`` to ``melra_execute``).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from maka_core.errors import CodecError, ConfigError
from maka_core.facts import canonical_json
from maka_core.facts.usage import MAX_STEP_COUNT, REQUIRED_COUNTS, count_problem
from maka_core.providers.base import ModelOutput, ModelToolCall

if TYPE_CHECKING:
    from maka_core.facts.events import RuntimeEvent

FINISHED_TEXT = "(script finished)"
_RESULT_REF = re.compile(r"\{\{result:([^:{}]+):([^{}]+)\}\}")


def _invalid(where: str, message: str) -> ConfigError:
    return ConfigError("script_invalid", f"{where}: {message}", where=where)


_USAGE_KEYS = frozenset({"input", "output", "total", "cacheRead", "cacheCreation", "reasoning"})

#: A parsed step: its text, its calls (name, args) and the usage it reports.
Step = tuple[str | None, tuple[tuple[str, dict[str, Any]], ...], dict[str, int] | None]


def _parse_usage(where: str, usage: Any) -> dict[str, int]:
    if not isinstance(usage, dict) or not usage or set(usage) - _USAGE_KEYS:
        raise _invalid(f"{where}.usage", f"usage is an object of counts named {sorted(_USAGE_KEYS)}")
    for key, value in usage.items():
        if count_problem(value) is not None:
            raise _invalid(f"{where}.usage.{key}", f"a count is an integer from 0 to {MAX_STEP_COUNT}")
    if any(key not in usage for key in REQUIRED_COUNTS):
        raise _invalid(f"{where}.usage", f"usage reports {' and '.join(REQUIRED_COUNTS)} at least")
    return dict(usage)


def _parse_step(k: int, step: Any) -> Step:
    where = f"steps[{k}]"
    if (
        not isinstance(step, dict)
        or not set(step) & {"text", "toolCalls"}
        or set(step)
        - {
            "text",
            "toolCalls",
            "usage",
        }
    ):
        raise _invalid(where, 'a step is {"text": ...} and/or {"toolCalls": [...]} (and an optional usage)')
    text = step.get("text")
    if "text" in step and not isinstance(text, str):
        raise _invalid(where, "text must be a string")
    calls: list[tuple[str, dict[str, Any]]] = []
    if "toolCalls" in step:
        raw = step["toolCalls"]
        if not isinstance(raw, list) or not raw:
            raise _invalid(where, "toolCalls must be a non-empty list")
        for i, call in enumerate(raw):
            at = f"{where}.toolCalls[{i}]"
            if not isinstance(call, dict) or set(call) != {"name", "args"}:
                raise _invalid(at, 'a tool call is exactly {"name": ..., "args": {...}}')
            if not isinstance(call["name"], str) or not call["name"]:
                raise _invalid(at, "name must be a non-empty string")
            if not isinstance(call["args"], dict):
                raise _invalid(at, "args must be a JSON object")
            try:
                canonical_json.check(call["args"], "args")
            except CodecError as exc:
                raise _invalid(at, exc.message) from None
            calls.append((call["name"], call["args"]))
    usage = _parse_usage(where, step["usage"]) if "usage" in step else None
    return text, tuple(calls), usage


class ScriptedProvider:
    """Replays validated script steps by ``step_index``; counts its calls (``calls``)."""

    def __init__(self, steps: Sequence[Any]) -> None:
        """Validate ``steps`` (raises ``ConfigError(script_invalid)``)."""
        if not isinstance(steps, list | tuple):
            raise _invalid("steps", "must be a list")
        self._steps = tuple(_parse_step(k, s) for k, s in enumerate(steps))
        self.calls = 0
        #: Whether any call refers to an earlier result (only then does a step need the history).
        self.refers_to_results = any(
            _RESULT_REF.search(canonical_json.dumps(args)) for _, calls, _ in self._steps for _, args in calls
        )

    @classmethod
    def from_json(cls, value: Any) -> ScriptedProvider:
        """From a parsed script object ``{"steps": [...]}``."""
        if not isinstance(value, dict) or set(value) != {"steps"}:
            raise _invalid("script", 'a script is exactly {"steps": [...]}')
        return cls(value["steps"])

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedProvider:
        """From a script file (UTF-8 JSON)."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError("script_invalid", f"cannot read script {path}: {exc}", path=str(path)) from None
        try:
            value = canonical_json.loads(text)
        except CodecError as exc:
            raise ConfigError(
                "script_invalid", f"{path} is not valid JSON: {exc.message}", path=str(path)
            ) from None
        return cls.from_json(value)

    def __len__(self) -> int:
        return len(self._steps)

    def output_for(self, step_index: int) -> ModelOutput:
        """The output of step ``step_index`` (pure; ``complete`` also counts the call)."""
        if step_index < 0:
            raise ValueError("step_index is 0-based and non-negative")
        if step_index >= len(self._steps):
            return ModelOutput(text=FINISHED_TEXT)
        text, calls, usage = self._steps[step_index]
        return ModelOutput(
            text=text,
            tool_calls=tuple(
                ModelToolCall(id=f"call-{step_index}-{i}", name=name, args=copy.deepcopy(args))
                for i, (name, args) in enumerate(calls)
            ),
            usage=dict(usage) if usage is not None else None,
        )

    async def complete(
        self, history: Sequence[RuntimeEvent], tools: Sequence[dict[str, Any]], *, step_index: int
    ) -> ModelOutput:
        """Step ``step_index`` of the script, result references resolved from ``history``."""
        self.calls += 1
        output = self.output_for(step_index)
        if not output.tool_calls:
            return output
        results = _results(history)
        calls = tuple(
            ModelToolCall(id=c.id, name=c.name, args=_resolve(c.args, results)) for c in output.tool_calls
        )
        return ModelOutput(text=output.text, tool_calls=calls, usage=output.usage)


def _results(history: Sequence[RuntimeEvent]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for event in history:
        content = event.content
        if content is not None and content.kind == "function_response" and isinstance(content.result, dict):
            result = content.result
            # A text result (an operator's resolution, say) is referred to by the path ``text``.
            text = result.get("kind") == "text"
            out[content.id] = {"text": result.get("text")} if text else result.get("value")
    return out


def _resolve(value: Any, results: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        return {k: _resolve(v, results) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, results) for v in value]
    if isinstance(value, str):
        match = _RESULT_REF.fullmatch(value)
        if match is not None:
            found: Any = results.get(match.group(1))
            for part in match.group(2).split("."):
                if not isinstance(found, dict) or part not in found:
                    return value
                found = found[part]
            return found
    return value
