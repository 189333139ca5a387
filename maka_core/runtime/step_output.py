"""A vendor's answer to a model step, as data to check before any of it commits.

Two things in an answer are the vendor's word about the runtime's own books, and neither is taken
as given:

- **Usage** (``checked_usage``). Every count is an integer from 0 to ``MAX_STEP_COUNT``
  (``facts.usage``), and a session whose policy caps tokens needs a step's usage at all: a step
  that cannot be counted cannot be held to a cap. Anything else refuses the step with
  ``usage_invalid`` before anything of it commits; nothing is dropped. Not retryable, like
  ``provider_bad_request``: the vendor already did (and billed) the work this answer cannot
  account for, and a retry sends the same request again, spending tokens that may be uncountable
  again; under a cap that is exactly the spend the cap forbids. The turn fails with the code.
- **Call ids** (``call_ids``). A function call's ``id`` is its identity in the ledger (with its
  invocation: ``providerToolCallId``, ``duplicate_call``), and legal replay pairs calls with results
  by it across the session. A vendor's id is kept as the call's id whenever it is new to the
  session, so every honest vendor's ledger looks as it always did. Where it is not (a local
  server that says ``"c0"`` every step, or the same id twice in one answer) the call gets a
  runtime id, ``maka-<stepId>-<index>``, and the vendor's id is carried as data in
  ``providerOptions.maka.vendorCallId`` (``providers.base.vendor_call_options``); the providers map
  it back on the wire (``providers.base.WireCallIds``), so the vendor sees the ids it sent, tied to
  the results of its calls.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from maka_core.facts.events import RuntimeEvent
from maka_core.facts.usage import usage_problem
from maka_core.governance.policy_file import UsageLimits
from maka_core.providers.base import ModelOutput, ModelToolCall, usage_invalid, vendor_call_options
from maka_core.runtime import builders
from maka_core.runtime.contracts import RunIds


def capped(limits: UsageLimits | None) -> bool:
    """Whether a session's policy caps tokens (an operator's raise only raises a cap the policy
    sets, so this is also whether a cap is in force)."""
    return limits is not None and (
        limits.max_tokens_per_turn is not None or limits.max_tokens_per_session is not None
    )


def checked_usage(usage: Mapping[str, Any] | None, step_id: str, *, caps: bool) -> dict[str, Any] | None:
    """A step's usage as it may commit, or ``None`` (the vendor reported none and no cap is in
    force: unknown is not zero).

    Raises:
        ProviderError: ``usage_invalid`` (``field`` names the count), not retryable.
    """
    if usage is None:
        if caps:
            raise usage_invalid("report", "is missing, and the session's policy caps tokens", stepId=step_id)
        return None
    problem = usage_problem(usage)
    if problem is not None:
        raise usage_invalid(*problem, stepId=step_id)
    return dict(usage)


def call_ids(
    calls: Sequence[ModelToolCall], step_id: str, taken: Collection[str]
) -> list[tuple[str, str | None]]:
    """Each call's ledger id and, when that is not the vendor's own, the vendor's id.

    ``taken``: the call ids the session has committed. A vendor id that is a non-empty string new
    to the session and to this answer is the call's id; any other gets ``maka-<stepId>-<index>``
    (``:`` made ``-``), made unique if a vendor ever sent that too.
    """
    used: set[str] = set()  # this answer's ids (``taken`` is the session's, never copied)
    out: list[tuple[str, str | None]] = []
    for index, call in enumerate(calls):
        vendor = call.id if isinstance(call.id, str) and call.id else None
        if vendor is not None and vendor not in taken and vendor not in used:
            out.append((vendor, None))
            used.add(vendor)
            continue
        own = base = f"maka-{step_id}-{index}".replace(":", "-")
        n = 1
        while own in taken or own in used:
            n += 1
            own = f"{base}-{n}"
        used.add(own)
        out.append((own, vendor))
    return out


def step_batch(
    ids: RunIds,
    step_id: str,
    output: ModelOutput,
    usage: dict[str, Any] | None,
    ops: Sequence[str],
    taken: Collection[str],
    ts: int,
) -> list[RuntimeEvent]:
    """The events a step commits in one transaction: its text, its calls (``ops``: their operation
    ids, in order) and its checked usage.

    Raises:
        ProviderError: ``usage_invalid`` for a usage Maka's ``tokenUsage`` shape refuses anyway (a
            key it does not know): the step is refused, never committed without its account.
    """
    batch: list[RuntimeEvent] = []
    if output.text is not None or not output.tool_calls:
        batch.append(builders.model_text(ids, step_id, output.text or "", ts))
    for index, (call, op, (call_id, vendor)) in enumerate(
        zip(output.tool_calls, ops, call_ids(output.tool_calls, step_id, taken), strict=True)
    ):
        options = vendor_call_options(vendor) if vendor is not None else None
        batch.append(
            builders.model_call(ids, step_id, index, call_id, call.name, dict(call.args), op, ts, options)
        )
    if usage is not None:
        try:
            batch.append(builders.step_usage(ids, step_id, usage, ts))
        except ValueError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise usage_invalid("shape", f"is not Maka's tokenUsage ({first})", stepId=step_id) from None
    return batch
