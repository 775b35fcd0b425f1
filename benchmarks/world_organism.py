"""Size and cost of the synthetic world presets, and how well BM25 serves the expert queries.

Run: python benchmarks/world_organism.py [--repeats 5]
Prints a markdown table: generation + BPE training wall time (median of repeats), corpus size in
passages and BPE tokens, questions per hop count, and the share of expert hop queries whose gold
passage BM25 ranks first / in the top 3 (plain lowercase word tokens, and stemmed + stopwords).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import bm25s
import Stemmer

from llds.data.world import WorldConfig, generate_world
from llds.models.bpe import tokenizer_for_world

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _bm25_hits(world, stem: bool) -> tuple[float, float]:
    ids = [d["id"] for d in world.corpus]
    hops = [h for ex in world.train + world.test for h in ex.metadata["chain"]]
    retriever = bm25s.BM25()
    if stem:
        stemmer = Stemmer.Stemmer("english")

        def tok(xs):
            return bm25s.tokenize(xs, stopwords="en", stemmer=stemmer, show_progress=False)
    else:

        def tok(xs):
            return [_words(x) for x in xs]

    retriever.index(tok([d["contents"] for d in world.corpus]), show_progress=False)
    results, _ = retriever.retrieve(tok([h["query"] for h in hops]), k=3, show_progress=False)
    top1 = sum(ids[r[0]] == h["doc_id"] for r, h in zip(results, hops, strict=True))
    top3 = sum(h["doc_id"] in {ids[j] for j in r} for r, h in zip(results, hops, strict=True))
    return top1 / len(hops), top3 / len(hops)


def measure(preset: str, repeats: int) -> dict[str, object]:
    gen, bpe = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        world = generate_world(WorldConfig.preset(preset))
        t1 = time.perf_counter()
        tok = tokenizer_for_world(world, 8000)
        t2 = time.perf_counter()
        gen.append(t1 - t0)
        bpe.append(t2 - t1)
    stats = world.stats()
    corpus_tokens = sum(len(tok(d["contents"])["input_ids"]) for d in world.corpus)
    q_tokens = statistics.median(len(tok(ex.question)["input_ids"]) for ex in world.train)
    return {
        "preset": preset,
        "entities": stats["entities"],
        "passages": stats["passages"],
        "train by hops": stats["train_by_hops"],
        "test by hops": stats["test_by_hops"],
        "BPE vocab": len(tok),
        "corpus tokens": corpus_tokens,
        "median question tokens": q_tokens,
        "generate s": statistics.median(gen),
        "BPE train s": statistics.median(bpe),
        "BM25 top1/top3 (plain)": "{:.3f} / {:.3f}".format(*_bm25_hits(world, stem=False)),
        "BM25 top1/top3 (stem)": "{:.3f} / {:.3f}".format(*_bm25_hits(world, stem=True)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = [measure(p, args.repeats) for p in ("organism", "hard")]
    print(f"machine: {machine()}")
    print(
        f"command: python benchmarks/world_organism.py --repeats {args.repeats} "
        "(times: median of repeats)"
    )
    print()
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        cells = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()]
        print("| " + " | ".join(cells) + " |")
    ratio = rows[1]["generate s"] / rows[0]["generate s"]
    print(f"\nhard / organism generation time ratio: {ratio:.1f}x")


if __name__ == "__main__":
    main()
