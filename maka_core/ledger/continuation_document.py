"""The offline planner's pure core: one INPUT document in, the reference planner's JSON out.

``maka ledger plan-continuation INPUT.json --json`` reads the document with
:func:`parse_document`, calls :func:`plan_continuation_document` and prints the result; a
malformed document raises ``ConfigError`` with code ``continuation_input_invalid`` (exit 2). The
document carries the source headers, the ledgers, the claim authority, the existing-continuation
lookup and either a safety observation or the host's inputs (``maka-continuation-facts.md``
§1.1, §2.1).

The document is read as the reference reads it, with ``JSON.parse``, not with the ledger's
lossless rule: it is an input, not a ledger row. So ``-0`` is JavaScript's -0 (equal to 0 in
every comparison, printed ``0``), a literal past a double's range is an infinity (printed
``null``) and one below it 0, an integer past 2**53 the nearest double, ``1.0`` the number 1, and
a repeated key keeps its last value at its first position. Inside a ledger the reference's
canonical decoding still refuses an event holding -0 or an infinity (its JSON would not give it
back), so such a ledger is unreadable and the planner parks on it; elsewhere the value plans
like any other. NaN and Infinity literals are not JSON and are refused, as ``JSON.parse`` refuses
them; a lone surrogate escape, which ``JSON.parse`` accepts, is refused too (it has no UTF-8
form to print or hash here).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from maka_core.errors import ConfigError
from maka_core.facts import canonical_json
from maka_core.ledger.continuation import SafetyObservation, id_source, park, plan_continuation
from maka_core.ledger.lineage import ContinuationSources


def _invalid(message: str) -> ConfigError:
    return ConfigError("continuation_input_invalid", message)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _js_number(value: float) -> int | float:
    """A double as JavaScript holds it: -0 and infinities kept, an integral safe value as int."""
    if value == 0:
        return value if math.copysign(1.0, value) < 0 else 0
    if value.is_integer() and abs(value) <= canonical_json.MAX_SAFE_INTEGER:
        return int(value)
    return value


def _not_json(name: str) -> Any:
    raise _invalid(f"{name} is not JSON")


def _last_key_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    return dict(pairs)


def parse_document(raw: bytes) -> Any:
    """Read INPUT.json as ``JSON.parse`` reads it (see the module docstring).

    Raises:
        ConfigError: ``continuation_input_invalid`` for text that is not JSON or not UTF-8, or
            that holds a lone surrogate.
    """
    try:
        value = json.loads(
            raw.decode("utf-8"),
            parse_int=lambda text: _js_number(float(text)),
            parse_float=lambda text: _js_number(float(text)),
            parse_constant=_not_json,
            object_pairs_hook=_last_key_wins,
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _invalid(f"the input is not JSON: {exc}") from None
    _refuse_lone_surrogates(value)
    return value


def _refuse_lone_surrogates(value: Any) -> None:
    if isinstance(value, str):
        if _LONE_SURROGATE.search(value):
            raise _invalid("the input holds a lone surrogate")
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_lone_surrogates(key)
            _refuse_lone_surrogates(item)
    elif isinstance(value, list):
        for item in value:
            _refuse_lone_surrogates(item)


def _as_printed(value: Any) -> Any:
    """A result as ``JSON.stringify`` prints it: -0 as 0, an infinity as null, an integral
    double below 1e21 without a fraction."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return int(value) if value.is_integer() and abs(value) < 1e21 else value
    if isinstance(value, dict):
        return {k: _as_printed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_printed(v) for v in value]
    return value


def _string(doc: Mapping[str, Any], key: str, where: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str):
        raise _invalid(f"{where}.{key} must be a string")
    return value


def _bool(doc: Mapping[str, Any], key: str, where: str) -> bool:
    value = doc.get(key)
    if not isinstance(value, bool):
        raise _invalid(f"{where}.{key} must be a boolean")
    return value


def _names(doc: Mapping[str, Any], where: str) -> tuple[str, ...]:
    value = doc.get("availableToolNames", [])
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise _invalid(f"{where}.availableToolNames must be a list of strings")
    return tuple(value)


def _number(value: Any, where: str) -> Any:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise _invalid(f"{where} must be a number")
    return value


def _checkpoint(doc: Mapping[str, Any], where: str) -> Mapping[str, Any] | None:
    value = doc.get("workspaceCheckpoint")
    if value is None:
        return None
    if not isinstance(value, Mapping) or not isinstance(value.get("restored"), bool):
        raise _invalid(f"{where}.workspaceCheckpoint must be {{ref?, restored, runtimeEventHighWater}}")
    if "ref" in value and not isinstance(value["ref"], str):
        raise _invalid(f"{where}.workspaceCheckpoint.ref must be a string")
    _number(value.get("runtimeEventHighWater"), f"{where}.workspaceCheckpoint.runtimeEventHighWater")
    return value


def _observation(doc: Any) -> SafetyObservation:
    if not isinstance(doc, Mapping):
        raise _invalid("observation must be an object")
    return SafetyObservation(
        current_cwd=_string(doc, "currentCwd", "observation"),
        source_workspace_identity=_string(doc, "sourceWorkspaceIdentity", "observation"),
        current_workspace_identity=_string(doc, "currentWorkspaceIdentity", "observation"),
        background_operations_settled=_bool(doc, "backgroundOperationsSettled", "observation"),
        available_tool_names=_names(doc, "observation"),
        expected_runtime_event_high_water=_number(
            doc.get("expectedRuntimeEventHighWater"), "observation.expectedRuntimeEventHighWater"
        ),
        workspace_checkpoint=_checkpoint(doc, "observation"),
    )


def _sources(doc: Mapping[str, Any]) -> ContinuationSources:
    runs, ledgers = doc.get("runs"), doc.get("ledgers")
    if not isinstance(runs, Mapping) or not all(isinstance(h, Mapping) for h in runs.values()):
        raise _invalid("runs must map run ids to AgentRunHeader objects")
    if not isinstance(ledgers, Mapping):
        raise _invalid("ledgers must map run ids to lists of RuntimeEvents")
    claims = doc.get("continuationClaims")
    if claims is not None and claims != "unavailable" and not isinstance(claims, Mapping):
        raise _invalid('continuationClaims must be "unavailable" or an object')
    lookup = doc.get("findExistingContinuation", "from_runs")
    if lookup not in ("from_runs", "absent") and not (
        isinstance(lookup, list) and all(isinstance(e, Mapping) for e in lookup)
    ):
        raise _invalid('findExistingContinuation must be "from_runs", "absent" or a list')
    return ContinuationSources(
        runs=runs,
        ledgers=ledgers,
        claims=claims,
        existing=None if lookup == "absent" else lookup,
    )


def _host_observation(host: Any, source_header: Any) -> SafetyObservation | str:
    """The host checks (§2.1): a park reason, or the observation the host would pass."""
    if not isinstance(host, Mapping):
        raise _invalid("host must be an object")
    if host.get("featureEnabled") is not True:
        return "resume_feature_disabled"
    if host.get("inspectorConfigured") is False:
        return "safety_observation_unavailable"
    if not isinstance(source_header, Mapping):
        return "source_run_unreadable"
    identity = source_header.get("workspaceIdentity")
    if not isinstance(identity, str) or not identity:
        return "workspace_identity_missing"
    observed = host.get("observation")
    if observed is None:
        return "safety_observation_unavailable"
    if not isinstance(observed, Mapping):
        raise _invalid("host.observation must be an object or null")
    return SafetyObservation(
        current_cwd=_string(host, "sessionCwd", "host"),
        source_workspace_identity=identity,
        current_workspace_identity=_string(observed, "workspaceIdentity", "host.observation"),
        background_operations_settled=_bool(observed, "backgroundOperationsSettled", "host.observation"),
        available_tool_names=_names(observed, "host.observation"),
        expected_runtime_event_high_water=_number(
            host.get("expectedRuntimeEventHighWater"), "host.expectedRuntimeEventHighWater"
        ),
        workspace_checkpoint=_checkpoint(observed, "host.observation"),
    )


def plan_continuation_document(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Run the planner over one INPUT document and return the reference result JSON.

    Raises:
        ConfigError: ``continuation_input_invalid`` for a document of the wrong shape.
    """
    if not isinstance(doc, Mapping):
        raise _invalid("the input must be a JSON object")
    session_id = _string(doc, "sessionId", "$")
    source_run_id = _string(doc, "sourceRunId", "$")
    sources = _sources(doc)
    ids = doc.get("ids", [])
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise _invalid("ids must be a list of strings")
    if "host" in doc:
        observation = _host_observation(doc["host"], sources.runs.get(source_run_id))
        if isinstance(observation, str):
            return park(observation).to_json()
    else:
        observation = _observation(doc.get("observation"))
    plan = plan_continuation(session_id, source_run_id, observation, sources, id_source(ids))
    return _as_printed(plan.to_json())  # type: ignore[no-any-return]
