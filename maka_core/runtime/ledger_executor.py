"""The ledger thread: one thread for all ledger work, with group commit when sessions queue up.

Work submitted here runs on ONE thread, in submission order (see ``runtime``'s docstring for why).
When the thread finds more than one item waiting, it runs them back to back inside one shared
transaction (``Ledger.group``; ``store.group_commit``): each writer is a SAVEPOINT, the group
commits once, and only then is any of them released. An item whose write refuses is rolled back
alone and fails alone; a group whose commit fails fails every member that ran in it (none of its
writes is durable, so no caller may act on one); items not yet run when a group broke run in the
next group. A lone item runs exactly as before: its writers commit each on their own.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from maka_core.store.group_commit import WriteGroup

#: Most items in one group: bounds how long the first of them waits for the shared commit.
MAX_GROUP = 32

_STOP = object()


@dataclass
class _Item:
    future: Future[Any]
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    ok: bool = False
    value: Any = field(default=None)

    def call(self) -> None:
        try:
            self.value, self.ok = self.fn(*self.args, **self.kwargs), True
        except BaseException as exc:  # delivered to the caller, like ThreadPoolExecutor does
            self.value, self.ok = exc, False

    def deliver(self, failure: BaseException | None = None) -> None:
        if failure is not None and self.ok:
            self.future.set_exception(failure)
        elif self.ok:
            self.future.set_result(self.value)
        else:
            self.future.set_exception(self.value)


class LedgerExecutor(Executor):
    """A single-thread executor; ``group`` (None: never group) opens a shared transaction."""

    def __init__(
        self,
        group: Callable[[], AbstractContextManager[WriteGroup]] | None,
        *,
        max_group: int = MAX_GROUP,
        name: str = "maka-ledger",
    ) -> None:
        self._group = group
        self._max_group = max_group
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        #: Items run and groups committed (the benchmark and tests read these).
        self.grouped_items = 0
        self.groups = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if self._closed:
            raise RuntimeError("cannot schedule new futures after shutdown")
        future: Future[Any] = Future()
        self._queue.put(_Item(future, fn, args, kwargs))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if not self._closed:
            self._closed = True
            if cancel_futures:
                self._drain_cancel()
            self._queue.put(_STOP)
        if wait and self._thread is not threading.current_thread():
            self._thread.join()

    def _drain_cancel(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Item):
                item.future.cancel()

    def _loop(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is _STOP:
                return
            batch: list[_Item] = [first]
            while len(batch) < self._max_group:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    stop = True
                    break
                batch.append(more)
            items = [item for item in batch if item.future.set_running_or_notify_cancel()]
            try:
                if len(items) > 1 and self._group is not None:
                    self._run_group(items)
                else:
                    for item in items:
                        item.call()
                        item.deliver()
            except BaseException as exc:  # a fault of this loop itself: no caller may wait forever
                for item in items:
                    if not item.future.done():
                        item.future.set_exception(exc)

    def _run_group(self, items: list[_Item]) -> None:
        assert self._group is not None
        pending = items
        while pending:
            ran: list[_Item] = []
            rest: list[_Item] = []
            try:
                with self._group() as group:
                    for i, item in enumerate(pending):
                        item.call()
                        ran.append(item)
                        if group.broken is not None:
                            rest = pending[i + 1 :]
                            break
            except BaseException as failure:
                if not ran:  # BEGIN itself failed: each item on its own (their writers retry busy)
                    for item in pending:
                        item.call()
                        item.deliver()
                    return
                for item in ran:
                    item.deliver(failure)
                pending = rest
                continue
            self.groups += 1
            self.grouped_items += len(ran)
            for item in ran:
                item.deliver()
            pending = rest
