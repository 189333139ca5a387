"""Streamed model steps: the vendor's text, as it arrives, into the step's partial snapshot.

A session started with ``stream`` (``SessionConfig.stream``) asks a provider that streams
(``StreamingProvider``: the OpenAI-compatible and Anthropic ones) for its answer as deltas. Each
delta goes to a mutable snapshot beside the ledger (``store.partials``), written on the ledger
thread as soon as the first token arrives and then at most every ``FLUSH_S``. The snapshot is never
an event: the step's committed output (``model_step``) stays the one fact, byte for byte what an
unstreamed call of the same answer commits, and its commit deletes the snapshot. A step whose
stream fails deletes its snapshot; a worker killed mid-stream leaves one, which the re-run step
overwrites from its first token and every reader ignores once the step has committed.

Writing the snapshot is best effort: a failed write is logged and the step goes on, since nothing
depends on it but a reader's view of a step still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, runtime_checkable

from maka_core.facts.clock import now_ms
from maka_core.facts.events import RuntimeEvent
from maka_core.observe import MODEL_FIRST_TOKEN_SECONDS
from maka_core.providers import ModelOutput, Provider
from maka_core.runtime.contracts import RunIds
from maka_core.runtime.runtime import Runtime

log = logging.getLogger(__name__)

#: The snapshot is written at most this often (seconds): the first token at once, then batched.
FLUSH_S: Final = 0.1


@runtime_checkable
class StreamingProvider(Protocol):
    """A provider that can also answer a step as a stream of text deltas."""

    async def stream(
        self,
        history: Sequence[RuntimeEvent],
        tools: Sequence[dict[str, Any]],
        *,
        step_index: int,
        on_text: Callable[[str], None],
    ) -> ModelOutput:
        """``Provider.complete``, calling ``on_text`` with each text delta as it arrives."""
        ...


class PartialSnapshot:
    """One attempt's text so far, flushed to ``step_partials`` by a task of its own."""

    def __init__(self, rt: Runtime, ids: RunIds, step_id: str, labels: dict[str, str]) -> None:
        self._rt = rt
        self._ids = ids
        self._step_id = step_id
        self._labels = labels
        self._started_ms = now_ms()
        self._began = time.perf_counter()
        self._parts: list[str] = []
        self._dirty = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Seconds from the request to the first text delta (``None``: no text yet).
        self.first_token_s: float | None = None

    def add(self, text: str) -> None:
        """A text delta arrived (called by the provider, on the event loop)."""
        if not text or self._stop.is_set():
            return
        if self.first_token_s is None:
            self.first_token_s = time.perf_counter() - self._began
            self._rt.observer.observe(MODEL_FIRST_TOKEN_SECONDS, self.first_token_s, **self._labels)
        self._parts.append(text)
        self._dirty.set()
        if self._task is None:
            self._task = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        while True:
            await self._dirty.wait()
            if self._stop.is_set():
                return
            self._dirty.clear()
            text = "".join(self._parts)
            try:
                await self._rt.on_ledger(functools.partial(self._write, text))
            except Exception as exc:
                log.warning("step %s: the partial snapshot was not written (%s)", self._step_id, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), FLUSH_S)

    def _write(self, text: str) -> None:
        self._rt.ledger.put_partial(
            self._step_id,
            session_id=self._ids.session_id,
            run_id=self._ids.run_id,
            text=text,
            started_at=self._started_ms,
            now=now_ms(),
        )

    async def close(self) -> None:
        """Stop flushing; returns once a write under way has ended (none follows)."""
        self._stop.set()
        self._dirty.set()
        if self._task is not None:
            await self._task


def streams(provider: Provider, asked: bool | None) -> StreamingProvider | None:
    """The provider as a streaming one when the session asked for streaming and it can."""
    return provider if asked and isinstance(provider, StreamingProvider) else None


async def streamed(
    rt: Runtime,
    provider: StreamingProvider,
    ids: RunIds,
    step_id: str,
    history: Sequence[RuntimeEvent],
    tools: Sequence[dict[str, Any]],
    step_index: int,
    labels: dict[str, str],
) -> ModelOutput:
    """One streamed provider call, its deltas into the step's snapshot. A call that fails deletes
    the snapshot (the retried step streams again); one that answers leaves it for the step's
    commit to delete (``clear_after_commit``)."""
    snapshot = PartialSnapshot(rt, ids, step_id, labels)
    try:
        output = await provider.stream(history, tools, step_index=step_index, on_text=snapshot.add)
    except BaseException:
        await snapshot.close()
        with contextlib.suppress(Exception):
            await rt.on_ledger(lambda: rt.ledger.clear_partial(step_id))
        raise
    await snapshot.close()
    return output


def clear_after_commit(rt: Runtime, step_id: str) -> None:
    """On the ledger thread, right after the step's output committed: its snapshot is superseded.
    A failure is logged only (a reader ignores the row of a committed step)."""
    try:
        rt.ledger.clear_partial(step_id)
    except Exception as exc:
        log.warning("step %s: the partial snapshot was not cleared (%s)", step_id, exc)
