"""`llds index`: build a BM25 or dense index from a corpus jsonl and save it to a directory."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

HELP = "Build a retrieval index (BM25 or dense) from a corpus jsonl."
ALIASES = {
    "--corpus": "corpus",
    "--wiki": "wiki",
    "--out": "out",
    "--model": "model",
    "--no-progress": "progress=false",
}
OUTPUT_DIRS = ("out",)
"""directories this command writes: refused up front when they exist as files"""
OUTPUT_OWNS = ("meta.json",)
"""what an earlier output of this command holds: such a folder may be written again"""
OUTPUT_FILES = ("write_corpus",)
"""files this command writes: never one of its inputs"""


CONFIG = "llds.retrieval.config:IndexConfig"


def run(cfg: Any, args: argparse.Namespace) -> int:
    from llds.retrieval.corpus import write_corpus
    from llds.retrieval.factory import build_retriever, corpus_passages

    started = time.perf_counter()
    passages = list(corpus_passages(cfg.corpus, wiki=cfg.wiki, wiki_max_words=cfg.wiki_max_words))
    if cfg.write_corpus:
        write_corpus(cfg.write_corpus, passages)
    retriever = build_retriever(
        passages,
        method=cfg.method,
        model_dir=cfg.model,
        show_progress=cfg.progress,
        source=cfg.corpus or "the Wikipedia summaries",
    )
    retriever.save(cfg.out)
    print(
        f"indexed {len(passages)} passages ({cfg.method}) into {cfg.out} "
        f"in {time.perf_counter() - started:.1f}s",
        file=sys.stderr,
    )
    return 0
