"""Micro-batching: concurrent requests share one backend call.

Everything queued when the worker becomes free (up to `max_batch_queries` queries, plus what
arrives within `max_wait_s`, 0 by default) is merged into one batch; the backend runs once,
in a worker thread so the event loop keeps accepting requests, at
the largest `topk` of the batch, and each request gets its own slice, truncated to its `topk`.
While one batch runs the next one fills up, so under load the batch size adapts by itself and
an idle server adds no delay; a positive `max_wait_s` trades latency for larger batches (useful
for backends with a high per-call cost, e.g. dense encoders on a GPU).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from llds.retrieval.base import Hit

SearchFn = Callable[[Sequence[str], int], list[list[Hit]]]


@dataclass
class _Pending:
    queries: list[str]
    k: int
    future: asyncio.Future[list[list[Hit]]]


@dataclass
class BatcherStats:
    backend_calls: int = 0
    queries: int = 0
    requests: int = 0
    largest_batch: int = 0
    backend_seconds: float = field(default=0.0)


class MicroBatcher:
    """Start with `start()` inside the running loop; `stop()` finishes queued work first."""

    def __init__(
        self, search: SearchFn, *, max_batch_queries: int = 256, max_wait_s: float = 0.0
    ) -> None:
        self._search = search
        self.max_batch_queries = max_batch_queries
        self.max_wait_s = max_wait_s
        self.stats = BatcherStats()
        self._queue: asyncio.Queue[_Pending | None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retrieval")

    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Drain: everything already queued is answered, then the worker exits."""
        if self._queue is not None and self._task is not None:
            await self._queue.put(None)
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._executor.shutdown(wait=True)

    async def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if self._queue is None:
            raise RuntimeError("MicroBatcher.start() was not called")
        if not queries:
            return []
        future: asyncio.Future[list[list[Hit]]] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(queries, k, future))
        return await future

    async def _collect(self, first: _Pending) -> tuple[list[_Pending], bool]:
        assert self._queue is not None
        batch = [first]
        total = len(first.queries)
        if self.max_wait_s <= 0:
            await asyncio.sleep(0)  # let requests that are already being parsed enqueue
        deadline = time.monotonic() + self.max_wait_s
        while total < self.max_batch_queries:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), remaining)
                except asyncio.TimeoutError:
                    break
            if item is None:
                return batch, True
            batch.append(item)
            total += len(item.queries)
        return batch, False

    async def _run(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        stopping = False
        while True:
            if stopping and self._queue.empty():
                return
            first = await self._queue.get()
            if first is None:
                stopping = True
                continue
            batch, saw_stop = await self._collect(first)
            stopping = stopping or saw_stop
            live = [p for p in batch if not p.future.done()]  # drop cancelled callers
            if not live:
                continue
            queries = [q for p in live for q in p.queries]
            k = max(p.k for p in live)
            started = time.perf_counter()
            try:
                results = await loop.run_in_executor(self._executor, self._search, queries, k)
                if len(results) != len(queries):
                    raise RuntimeError(
                        f"backend returned {len(results)} results for {len(queries)} queries"
                    )
            except Exception as exc:  # every caller of this batch learns about the failure
                for p in live:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            finally:
                self.stats.backend_seconds += time.perf_counter() - started
            self.stats.backend_calls += 1
            self.stats.requests += len(live)
            self.stats.queries += len(queries)
            self.stats.largest_batch = max(self.stats.largest_batch, len(queries))
            offset = 0
            for p in live:
                part = results[offset : offset + len(p.queries)]
                offset += len(p.queries)
                if not p.future.done():
                    p.future.set_result([hits[: p.k] for hits in part])
