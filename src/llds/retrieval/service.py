"""The Search-R1-compatible retrieval HTTP service (FastAPI app + uvicorn runner).

Compared with the reference server: `return_scores=false` works, every bad request gets a 4xx JSON
`{"error", "detail", "field"}` instead of a 500 or a crash, requests are bounded (queries per
request, query length, topk, body size), concurrent requests share one backend call (see
`batcher.py`) and SIGINT/SIGTERM drain in-flight requests before exiting. The listening socket
is bound before the service says where it serves (`bind_socket`), so a busy port is one error.
"""

from __future__ import annotations

import errno
import json
import logging
import signal
import socket
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from llds.errors import UserInputError
from llds.retrieval.base import Retriever
from llds.retrieval.batcher import MicroBatcher
from llds.retrieval.protocol import Limits, RequestError, encode_hits, parse_request

log = logging.getLogger("llds.retrieval.service")


def _json(body: Any, status: int = 200) -> Response:
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return Response(content=data, status_code=status, media_type="application/json")


def _error(err: RequestError) -> Response:
    return _json(err.body(), err.status)


async def _read_body(request: Request, limit: int) -> bytes:
    """Read the body, refusing (413) as soon as it exceeds `limit` bytes."""
    declared = request.headers.get("content-length")
    too_big = RequestError(413, "body_too_large", f"request body exceeds {limit} bytes")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(
    retriever: Retriever,
    *,
    default_topk: int = 3,
    max_queries: int = 512,
    max_query_chars: int = 4096,
    max_topk: int = 100,
    max_body_bytes: int = 4 * 1024 * 1024,
    max_batch_queries: int = 256,
    batch_wait_ms: float = 0.0,
) -> FastAPI:
    """A FastAPI app serving `POST /retrieve` and `GET /health` over `retriever`."""
    if not 1 <= default_topk <= max_topk:
        raise ValueError(f"default_topk must be between 1 and max_topk={max_topk}")
    limits = Limits(max_queries, max_query_chars, max_topk, max_body_bytes)
    batcher = MicroBatcher(
        retriever.search, max_batch_queries=max_batch_queries, max_wait_s=batch_wait_ms / 1000
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        yield
        await batcher.stop()  # uvicorn has already let in-flight requests finish
        print(
            f"retrieval service stopped after {batcher.stats.requests} requests",
            file=sys.stderr,
            flush=True,
        )

    app = FastAPI(title="llds retrieval", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.batcher = batcher
    app.state.retriever = retriever

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        name = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _json({"error": name, "detail": str(exc.detail)}, exc.status_code)

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path)
        return _json({"error": "internal_error", "detail": f"{type(exc).__name__}: {exc}"}, 500)

    @app.post("/retrieve")
    async def retrieve(request: Request) -> Response:
        try:
            body = await _read_body(request, limits.max_body_bytes)
            req = parse_request(body, default_topk, limits)
        except RequestError as err:
            return _error(err)
        try:
            results = await batcher.search(req.queries, req.topk)
        except Exception as exc:
            log.exception("backend search failed")
            return _json({"error": "backend_error", "detail": f"{type(exc).__name__}: {exc}"}, 500)
        return _json(encode_hits(results, req.return_scores))

    @app.get("/health")
    async def health() -> Response:
        stats = batcher.stats
        return _json(
            {
                "status": "ok",
                "documents": len(retriever) if hasattr(retriever, "__len__") else None,
                "method": getattr(retriever, "method", type(retriever).__name__),
                "default_topk": default_topk,
                "limits": {
                    "max_queries": max_queries,
                    "max_query_chars": max_query_chars,
                    "max_topk": max_topk,
                    "max_body_bytes": max_body_bytes,
                },
                "served": {
                    "requests": stats.requests,
                    "queries": stats.queries,
                    "backend_calls": stats.backend_calls,
                    "largest_batch": stats.largest_batch,
                },
            }
        )

    return app


MAX_PORT = 65535


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host:port` (not yet listening; `serve` listens on it).

    Binding first lets the caller announce the address only once it is really its own; a bad
    port, an unknown host or a port already in use is a UserInputError naming them.
    """
    if not 1 <= port <= MAX_PORT:
        raise UserInputError(f"port must be between 1 and {MAX_PORT}, got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UserInputError(f"host {host!r}: cannot resolve it ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    # as uvicorn does: a restarted server may take over a port whose old connections linger
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UserInputError(
                f"port {port} on {host} is already in use (another server?); stop it or choose "
                "another port"
            ) from None
        raise UserInputError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def serve(
    app: FastAPI,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    graceful_timeout_s: float = 30.0,
    sock: socket.socket | None = None,
) -> None:
    """Run `app` with uvicorn until SIGINT/SIGTERM; in-flight requests finish first.

    `sock` (from `bind_socket`) is served instead of binding `host:port` here.
    """
    import gc

    import uvicorn

    # The index and passages are long-lived; moving them out of the collector's reach keeps
    # full garbage collections (tens of ms with a large vocabulary) out of request latency.
    gc.collect()
    gc.freeze()
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=int(graceful_timeout_s),
        lifespan="on",
    )
    server = uvicorn.Server(config)
    if threading.current_thread() is not threading.main_thread():
        server.run(sockets=None if sock is None else [sock])
        return
    # uvicorn drains on SIGTERM, then raises the signal again for the handler it found: after
    # a drain that is the service's normal end, not the command line's "terminated" (and one
    # that comes before uvicorn listens for it stops the service as soon as it has started)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: _stop(server))
    try:
        server.run(sockets=None if sock is None else [sock])
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop(server: Any) -> None:
    """SIGTERM outside uvicorn's own handler: the server is (or will be) stopped."""
    server.should_exit = True
