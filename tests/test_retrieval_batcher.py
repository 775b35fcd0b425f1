"""Micro-batcher: concurrent requests become one backend call and get their own slices back."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from llds.retrieval.base import Hit
from llds.retrieval.batcher import MicroBatcher


class CountingBackend:
    """Returns k hits per query whose ids encode (query, rank); records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int]] = []
        self.threads: set[str] = set()

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        self.calls.append((list(queries), k))
        self.threads.add(threading.current_thread().name)
        return [[Hit(f"{q}#{r}", q, float(k - r)) for r in range(k)] for q in queries]


def test_concurrent_requests_share_one_backend_call() -> None:
    backend = CountingBackend()

    async def main() -> list[list[list[Hit]]]:
        batcher = MicroBatcher(backend.search, max_batch_queries=100, max_wait_s=0.05)
        batcher.start()
        out = await asyncio.gather(
            batcher.search(["a", "b"], 2), batcher.search(["c"], 5), batcher.search(["d"], 1)
        )
        await batcher.stop()
        return out

    first, second, third = asyncio.run(main())
    assert len(backend.calls) == 1
    assert backend.calls[0] == (["a", "b", "c", "d"], 5)  # the largest k of the batch
    assert [[h.id for h in hits] for hits in first] == [["a#0", "a#1"], ["b#0", "b#1"]]
    assert [h.id for h in second[0]] == [f"c#{r}" for r in range(5)]
    assert [h.id for h in third[0]] == ["d#0"]
    assert all(not name.startswith("MainThread") for name in backend.threads)


def test_batch_size_cap_splits_calls() -> None:
    backend = CountingBackend()

    async def main() -> None:
        batcher = MicroBatcher(backend.search, max_batch_queries=2, max_wait_s=0.05)
        batcher.start()
        await asyncio.gather(*(batcher.search([str(i)], 1) for i in range(4)))
        await batcher.stop()

    asyncio.run(main())
    assert [len(q) for q, _ in backend.calls] == [2, 2]


def test_backend_failure_reaches_every_caller_and_batcher_survives() -> None:
    state = {"fail": True}

    def search(queries: Sequence[str], k: int) -> list[list[Hit]]:
        if state["fail"]:
            raise RuntimeError("index broken")
        return [[Hit(q, q, 1.0)] for q in queries]

    async def main() -> list[list[Hit]]:
        batcher = MicroBatcher(search, max_wait_s=0.01)
        batcher.start()
        outcomes = await asyncio.gather(
            batcher.search(["x"], 1), batcher.search(["y"], 1), return_exceptions=True
        )
        assert all(isinstance(o, RuntimeError) for o in outcomes)
        state["fail"] = False
        ok = await batcher.search(["z"], 1)
        await batcher.stop()
        return ok

    assert asyncio.run(main()) == [[Hit("z", "z", 1.0)]]


def test_stop_answers_queued_requests_first() -> None:
    backend = CountingBackend()

    async def main() -> list[list[Hit]]:
        batcher = MicroBatcher(backend.search, max_wait_s=0.0)
        batcher.start()
        pending = asyncio.ensure_future(batcher.search(["late"], 1))
        await asyncio.sleep(0)  # request queued
        await batcher.stop()
        return await pending

    assert asyncio.run(main())[0][0].id == "late#0"


def test_search_before_start_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="start"):
        asyncio.run(MicroBatcher(CountingBackend().search).search(["a"], 1))
