"""`HTTPRetriever`: the `Retriever` interface over a remote `/retrieve` service.

Unlike the reference clients it has timeouts, retries connection failures, timeouts and 5xx
answers with exponential backoff (a restarting server is ridden out), never retries a 4xx (the
request itself is wrong: the server's message is raised), and splits long query lists into
several requests of at most `batch_size` queries. How long it keeps retrying is a number of
attempts (`retries`) or, for a training run that should outlast a server restart, a time
(`retry_seconds`).

For in-process retrieval there is no wrapper: a backend object (`BM25Retriever`,
`DenseRetriever`) IS the in-process retriever, with the same `search(queries, k)`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from llds.errors import UserInputError
from llds.retrieval.base import Hit, check_search
from llds.retrieval.protocol import ReplyError, decode_hits

log = logging.getLogger("llds.retrieval.client")


class RetrievalServiceError(RuntimeError):
    """The service answered with an error (4xx: bad request; 5xx after all retries)."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(message)
        self.status = status


def normalize_url(url: str) -> str:
    """Accept `http://host:port` or the full `/retrieve` URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UserInputError(f"retriever URL {url!r} must look like http://host:port[/retrieve]")
    path = parts.path.rstrip("/")
    if not path:
        path = "/retrieve"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


class HTTPRetriever:
    """A client for a Search-R1-compatible `/retrieve` endpoint (this project's or another)."""

    method = "http"

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 30.0,
        retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
        batch_size: int = 256,
        retry_seconds: float | None = None,
    ) -> None:
        """`retry_seconds`: keep retrying a failing request for this long (from its first
        failure; each attempt may also wait up to `timeout`) instead of `retries` times."""
        if retries < 0 or batch_size < 1 or timeout <= 0 or backoff < 0:
            raise UserInputError("HTTPRetriever: need retries >= 0, batch_size >= 1, timeout > 0")
        if retry_seconds is not None and not retry_seconds > 0:
            raise UserInputError(f"HTTPRetriever: retry_seconds must be > 0, got {retry_seconds}")
        self.url = normalize_url(url)
        self.retries = retries
        self.retry_seconds = retry_seconds
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.batch_size = batch_size
        self.retry_count = 0  # total retries made, for monitoring
        self._client = httpx.Client(timeout=timeout)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HTTPRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        check_search(queries, k)
        results: list[list[Hit]] = []
        for start in range(0, len(queries), self.batch_size):
            chunk = list(queries[start : start + self.batch_size])
            payload = {"queries": chunk, "topk": k, "return_scores": True}
            try:
                hits = decode_hits(self._post(payload))
            except ReplyError as exc:
                raise RetrievalServiceError(
                    200, f"{self.url}: the reply does not follow the Search-R1 schema: {exc}"
                ) from None
            if len(hits) != len(chunk):
                raise RetrievalServiceError(
                    200, f"{self.url}: {len(hits)} results for {len(chunk)} queries"
                )
            results.extend(hits)
        return results

    def health(self) -> dict[str, Any]:
        base = urlsplit(self.url)
        url = urlunsplit((base.scheme, base.netloc, "/health", "", ""))
        response = self._client.get(url)
        response.raise_for_status()
        return response.json()

    def _delay(self, attempt: int) -> float:
        return min(self.max_backoff, self.backoff * (2**attempt))

    def _may_retry(self, attempt: int, waited: float) -> bool:
        """Whether failed attempt number `attempt` (1-based) may be followed by another, when
        `waited` seconds will have passed since the first failure once the backoff is over."""
        if self.retry_seconds is not None:
            return waited <= self.retry_seconds
        return attempt <= self.retries

    def _post(self, payload: dict[str, Any]) -> Any:
        last: str = ""
        attempt = 0
        first_failure: float | None = None
        while True:
            if attempt:
                delay = self._delay(attempt - 1)
                now = time.monotonic()
                first_failure = now if first_failure is None else first_failure
                if not self._may_retry(attempt, now + delay - first_failure):
                    break
                self.retry_count += 1
                limit = (
                    f"up to {self.retry_seconds:g}s"
                    if self.retry_seconds is not None
                    else f"of {self.retries}"
                )
                log.warning(
                    "retrieval request failed (%s); retry %d (%s) in %.2fs",
                    last,
                    attempt,
                    limit,
                    delay,
                )
                time.sleep(delay)
            attempt += 1
            try:
                response = self._client.post(self.url, json=payload)
            except httpx.TransportError as exc:  # connection refused/reset, timeouts
                last = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code >= 500:
                last = f"HTTP {response.status_code}: {_message(response)}"
                continue
            if response.status_code >= 400:
                raise RetrievalServiceError(
                    response.status_code,
                    f"{self.url} rejected the request (HTTP {response.status_code}): "
                    f"{_message(response)}",
                )
            try:
                return response.json()
            except ValueError:
                raise RetrievalServiceError(
                    response.status_code, f"{self.url}: response is not JSON"
                ) from None
        raise RetrievalServiceError(
            None, f"{self.url}: no answer after {attempt} attempts; last error: {last}"
        )


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return str(body)[:300]
