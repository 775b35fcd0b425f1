"""A retrieval service that stops answering mid-run: every process stops at the same point
(before the update's collectives), and the run ends with one line saying where it stands."""

from __future__ import annotations

import contextlib
from pathlib import Path

from llds.retrieval.client import RetrievalServiceError
from llds.rollout import RolloutBatch, RolloutEngine, RolloutRequest
from llds.train.distributed import Dist


def generate_on_every_rank(
    engine: RolloutEngine,
    requests: list[RolloutRequest],
    dist: Dist,
    context: contextlib.AbstractContextManager,
) -> RolloutBatch:
    """This rank's rollouts; when the retriever stopped answering on any rank, every rank
    raises here, before the update's collectives: otherwise the others would go on into them
    with a rank that left and fail there with a transport error (or wait, by backend)."""
    failure: RetrievalServiceError | None = None
    try:
        with context:
            batch = engine.generate(requests)
    except RetrievalServiceError as exc:
        if exc.status is not None or not dist.enabled:
            raise  # the service answered (a bad request), or there is no one to tell
        failure = exc
    if dist.enabled and float(dist.sum(float(failure is not None))) > 0:
        raise failure or RetrievalServiceError(None, "the retriever failed on another rank")
    return batch


def retriever_gone_message(
    url: str, retry_seconds: float, step: int, last_logged: int, ckpt_root: Path
) -> str:
    """The one line a run stopped by an unreachable retriever ends with: which URL, where the
    run stands, and that the same command resumes it."""
    return (
        f"retriever {url} did not answer for retriever.retry_seconds={retry_seconds:g}s during "
        f"step {step}; the run stopped (metrics.jsonl up to step {last_logged}, checkpoints in "
        f"{ckpt_root}); once the retriever is back, resume with the same command"
    )
