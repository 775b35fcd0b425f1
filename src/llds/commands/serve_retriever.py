"""`llds serve-retriever`: the Search-R1-compatible `/retrieve` HTTP service."""

from __future__ import annotations

import argparse
import sys
from typing import Any

HELP = "Serve a corpus over the Search-R1 /retrieve HTTP API (BM25 built on the fly or an index)."
ALIASES = {
    "--index": "index",
    "--corpus": "corpus",
    "--wiki": "wiki",
    "--model": "model",
    "--host": "host",
    "--port": "port",
    "--topk": "topk",
    "--log-level": "log_level",
    "--no-progress": "progress=false",
}


CONFIG = "llds.retrieval.config:ServeConfig"


def run(cfg: Any, args: argparse.Namespace) -> int:
    from llds.retrieval.service import bind_socket, serve

    # bound before the (possibly long) indexing: a busy port fails at once, and "serving" is
    # printed only once the address is ours
    sock = bind_socket(cfg.host, cfg.port)
    try:
        app, documents = _app(cfg)
        sock.listen(2048)  # connections wait in the backlog until uvicorn has started
        print(
            f"serving {documents} passages on http://{cfg.host}:{cfg.port}/retrieve",
            file=sys.stderr,
            flush=True,
        )
        serve(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, sock=sock)
    finally:
        sock.close()
    return 0


def _app(cfg: Any) -> tuple[Any, int]:
    """The service app over the index or corpus the config names, and its passage count."""
    from llds.retrieval.factory import build_retriever, corpus_passages, load_index
    from llds.retrieval.service import create_app

    if cfg.index:
        retriever = load_index(cfg.index, model_dir=cfg.model)
    else:
        passages = corpus_passages(cfg.corpus, wiki=cfg.wiki)
        retriever = build_retriever(
            passages,
            method=cfg.method,
            model_dir=cfg.model,
            show_progress=cfg.progress,
            source=cfg.corpus or "the Wikipedia summaries",
        )
    app = create_app(
        retriever,
        default_topk=cfg.topk,
        max_queries=cfg.max_queries,
        max_query_chars=cfg.max_query_chars,
        max_topk=cfg.max_topk,
        max_batch_queries=cfg.max_batch_queries,
        batch_wait_ms=cfg.batch_wait_ms,
    )
    return app, len(retriever)
