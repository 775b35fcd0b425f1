"""`llds trivia-wiki`: the Red-Trivia questions answerable from the Wikipedia summaries, split.

A thin adapter: the keys are `llds.data.trivia_wiki.TriviaWikiConfig`'s, the work is
`build_trivia_wiki` over the agent's retriever and `write_trivia_wiki`.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

HELP = (
    "Keep the trivia questions whose answer the retriever finds (not in the question), split "
    "them into train/dev/test and held-out transfer lists."
)
ALIASES = {"--out": "out", "--retriever": "retriever", "--topk": "topk"}
OUTPUT_DIRS = ("out",)
"""directories this command writes: refused up front when they exist as files"""
OUTPUT_OWNS = ("counts.json",)
"""what an earlier output of this command holds: such a folder may be written again"""

CONFIG = "llds.data.trivia_wiki:TriviaWikiConfig"


def run(cfg: Any, args: argparse.Namespace) -> int:
    from llds.data.loaders import available_trivia_lists, load_trivia_lists
    from llds.data.trivia_wiki import build_trivia_wiki, write_trivia_wiki
    from llds.errors import UserInputError
    from llds.retrieval.factory import build_retriever, corpus_passages, open_answering_retriever

    known = set(available_trivia_lists())
    unknown = sorted(set(cfg.transfer_lists) - known)
    if unknown:
        raise UserInputError(
            f"transfer_lists: unknown list(s) {unknown}; available: {sorted(known)}"
        )
    started = time.perf_counter()
    examples = load_trivia_lists(list(cfg.lists) or None)
    if cfg.retriever:
        retriever = open_answering_retriever(cfg.retriever, key="retriever")
    else:
        retriever = build_retriever(corpus_passages(None, wiki=True), show_progress=False)
    result = build_trivia_wiki(examples, retriever, cfg)
    paths = write_trivia_wiki(result, cfg.out)
    totals = result.totals()
    print(
        f"{len(examples)} questions, {sum(totals.values())} kept: "
        + ", ".join(f"{name} {n}" for name, n in totals.items())
        + f" ({time.perf_counter() - started:.1f}s)",
        file=sys.stderr,
    )
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0
