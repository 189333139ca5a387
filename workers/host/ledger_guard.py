"""A worker's guard over its ledger: announce it, refuse a queue served against another one, and
stop loudly when it becomes unusable.

Every worker polls with an identity that names its ledger (``<pid>@<host>#<ledger fingerprint>``:
the first 72 bits of the sha256 of the ledger id in 12 base64url characters, short because the
identity is written into history on every workflow and activity task, about six times per tool
call, so every byte of it is paid per call; hashed because the id begins ``ledger-``, so its first
characters carry no entropy: the fingerprint of workers before this one, ``ledger`` plus two hex
digits, had 256 values).
Before polling, a worker asks Temporal who else polls its task queue; a live poller announcing a
different ledger means sessions would split between two ledgers (each worker's recovery blind to
the other's facts), so the newcomer refuses with ``ledger_mismatch``. A poller counts as live while
its last poll is recent: a long poll lasts about a minute, so a worker stopped a moment ago still
counts until ``LIVE_POLLER_S`` passes.

While serving, the watchdog stats the ledger every ``WATCH_INTERVAL_S`` (a ledger deleted while the
worker is idle is found before the next turn, not by it) and reads the store's ``health`` flag,
which the store sets on any writer fault (``ledger_replaced``, ``ledger_unwritable``,
``ledger_full``, ``maka_core.store.health``). Either one stops the worker with the code.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import socket
import time
from collections.abc import Callable

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.service import RPCError

from maka_core.errors import MakaError, StoreError
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.client.connect import server_gone

LEDGER_MARK = "#"
#: 72 bits (9 digest bytes, 12 base64url characters): a second ledger that collides takes ~2^71
#: tries to find, not 147.
FINGERPRINT_BYTES = 9
FINGERPRINT_CHARS = 12
LIVE_POLLER_S = 75.0
WATCH_INTERVAL_S = 0.5


def fingerprint(ledger_id: str | None) -> str:
    """The short form of a ledger id a worker announces (a mismatch detector, not an identity):
    every byte of the id counts, whatever its format."""
    if not ledger_id:
        return "unknown"
    digest = hashlib.sha256(ledger_id.encode("utf-8")).digest()[:FINGERPRINT_BYTES]
    return base64.urlsafe_b64encode(digest).decode("ascii")


def is_legacy(announced: str) -> bool:
    """A fingerprint in the form workers announced before 72-bit fingerprints (8 characters)."""
    return len(announced) != FINGERPRINT_CHARS


def worker_identity(ledger_id: str | None) -> str:
    """The identity this worker polls with: Temporal's usual ``pid@host`` plus its ledger."""
    return f"{os.getpid()}@{socket.gethostname()}{LEDGER_MARK}{fingerprint(ledger_id)}"


def ledger_of(identity: str) -> str | None:
    """The ledger fingerprint a poller announced, or None for a worker that announces none."""
    _, mark, rest = identity.rpartition(LEDGER_MARK)
    return rest if mark and rest else None


async def queue_ledgers(client: Client, task_queue: str, *, now: float | None = None) -> dict[str, str]:
    """identity -> ledger id of the live pollers on ``task_queue`` (workflow and activity pollers)."""
    now = time.time() if now is None else now
    found: dict[str, str] = {}
    for kind in (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY):
        request = DescribeTaskQueueRequest(
            namespace=client.namespace, task_queue=TaskQueue(name=task_queue), task_queue_type=kind
        )
        try:
            response = await client.workflow_service.describe_task_queue(request)
        except RPCError as exc:
            if not server_gone(exc):
                raise
            # The server went away between the worker's connect and this check (a restart): the
            # same refusal as a connect that found no server, not a traceback.
            raise MakaError(
                "temporal_unavailable",
                f"the Temporal server stopped answering while the worker started: {exc.message}",
                taskQueue=task_queue,
            ) from None
        for poller in response.pollers:
            ledger = ledger_of(poller.identity)
            seen = (
                poller.last_access_time.ToMicroseconds() / 1e6 if poller.HasField("last_access_time") else 0
            )
            if ledger is not None and now - seen < LIVE_POLLER_S:
                found[poller.identity] = ledger
    return found


def refuse_mismatch(
    ledger_id: str | None,
    task_queue: str,
    peers: dict[str, str],
    *,
    fingerprint_of: Callable[[str | None], str] = fingerprint,
) -> None:
    """Raises ``ledger_mismatch`` when a live peer on the queue serves another ledger, or announces
    an old-form fingerprint (which a foreign ledger can match by chance). ``fingerprint_of``: how
    this worker's own fingerprint is computed (a test passes the old function to show its flaw)."""
    own = fingerprint_of(ledger_id)
    others = {identity: ledger for identity, ledger in peers.items() if ledger != own}
    if others:
        identity, ledger = next(iter(others.items()))
        legacy = is_legacy(ledger)
        why = (
            "an old-form ledger fingerprint (a worker before 72-bit fingerprints: it may serve "
            "another ledger; stop the queue's old workers before starting upgraded ones)"
            if legacy
            else f"another ledger ({ledger})"
        )
        raise MakaError(
            "ledger_mismatch",
            f"task queue {task_queue!r} is served by {identity} against {why}; "
            "sessions would split between ledgers. Point this worker at the same ledger or another "
            f"task queue (a worker stopped less than {LIVE_POLLER_S:.0f} s ago still counts)",
            taskQueue=task_queue,
            ledgerId=ledger_id,
            peerIdentity=identity,
            peerLedgerId=ledger,
            peerFingerprintLegacy=legacy,
        )


async def check_queue(client: Client, task_queue: str, ledger_id: str | None) -> None:
    refuse_mismatch(ledger_id, task_queue, await queue_ledgers(client, task_queue))


async def watch(store: LedgerStore, stop: asyncio.Event, interval: float = WATCH_INTERVAL_S) -> StoreError:
    """Return the ledger's fault as soon as one is known; runs until cancelled otherwise."""
    while True:
        failure = store.health.failure
        if failure is None:
            try:
                store.health.check()
            except StoreError:
                failure = store.health.failure
        if failure is not None:
            stop.set()
            return failure
        await asyncio.sleep(interval)
