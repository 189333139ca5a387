"""The offline planner's pure core: one INPUT document in, the reference planner's JSON out.

``maka ledger plan-continuation INPUT.json --json`` reads the document, calls
:func:`plan_continuation_document` and prints the result; a malformed document raises
``ConfigError`` with code ``continuation_input_invalid`` (exit 2). The document carries the
source headers, the ledgers, the claim authority, the existing-continuation lookup and either
a safety observation or the host's inputs (``maka-continuation-facts.md`` §1.1, §2.1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from maka_core.errors import ConfigError
from maka_core.ledger.continuation import SafetyObservation, id_source, park, plan_continuation
from maka_core.ledger.lineage import ContinuationSources


def _invalid(message: str) -> ConfigError:
    return ConfigError("continuation_input_invalid", message)


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
    return plan.to_json()
