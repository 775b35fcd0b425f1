"""The reading expert for real QA: answer with the passage's own words, sometimes search twice.

A warm start trained to answer with the first alias of a trivia question's answer list learns
to produce answers from its own memory; one trained on one search per question never sees a
search fail. Measured on real multi-domain questions, such a warm start mostly searched once,
found the right passage and answered with the entity the question names. The reading expert
instead (1) answers with the answer as the retrieved passage writes it, (2) says which passage
it read, and (3) for a share of the questions first makes a short search that the retriever
shows to miss, then searches the whole question. `build_expert_episodes(reading=True)` lays
these plans out token for token.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import replace

from llds.data.example import QAExample
from llds.data.trivia_wiki import found_answers
from llds.retrieval.base import Hit, Retriever

PARTIAL_WORDS = (3, 4)
"""a short first search: the question's last 3 words, else its first 4"""


def passage_span(hits: Sequence[Hit], answers: Sequence[str]) -> tuple[str, str] | None:
    """`(title, span)` of the first passage that writes an accepted answer as whole words, the
    span exactly as the passage writes it (case, spacing); None when no passage does."""
    for hit in hits:
        body = hit.contents
        for answer in answers:
            words = answer.strip().split()
            if not words or not found_answers([answer], body):
                continue
            pattern = r"(?<!\w)" + r"\s+".join(re.escape(w) for w in words) + r"(?!\w)"
            match = re.search(pattern, body, flags=re.IGNORECASE)
            if match:
                return hit.title.strip() or "the first result", match.group(0)
    return None


def partial_queries(question: str) -> list[str]:
    """Short searches a hasty searcher might try first: a few of the question's words."""
    words = [w.strip("?!.,;:\"'") for w in question.split()]
    words = [w for w in words if w]
    last, first = PARTIAL_WORDS
    whole = " ".join(words).lower()
    out = []
    for q in (" ".join(words[-last:]), " ".join(words[:first])):
        if q and q.lower() != whole and q not in out:
            out.append(q)
    return out


def reading_examples(
    examples: Sequence[QAExample],
    retriever: Retriever,
    *,
    topk: int,
    miss_first: float = 0.0,
    seed: int = 0,
) -> tuple[list[QAExample], dict[str, int]]:
    """Each answerable example with its reading plan (`metadata["reading"]`: the queries and
    the title of the passage read) and the passage's span as its first answer; counts of what
    was kept, dropped (no passage writes an answer) and searched twice."""
    if not 0.0 <= miss_first <= 1.0:
        raise ValueError(f"miss_first must be in [0, 1], got {miss_first}")
    found = retriever.search([ex.question.strip() for ex in examples], topk)
    wants_miss = [random.Random(f"miss:{seed}:{ex.id}").random() < miss_first for ex in examples]
    candidates = [
        partial_queries(ex.question) if w else []
        for ex, w in zip(examples, wants_miss, strict=True)
    ]
    flat = [q for qs in candidates for q in qs]
    partial_hits = iter(retriever.search(flat, topk) if flat else [])
    counts = {"kept": 0, "no_span": 0, "searched_twice": 0}
    out: list[QAExample] = []
    for ex, hits, qs in zip(examples, found, candidates, strict=True):
        tried = [(q, next(partial_hits)) for q in qs]  # consume every candidate's hits
        span = passage_span(hits, ex.answers)
        if span is None:
            counts["no_span"] += 1
            continue
        title, answer = span
        misses = [
            q for q, h in tried if not found_answers(ex.answers, " ".join(x.contents for x in h))
        ]
        queries = [*misses[:1], ex.question.strip()]
        counts["searched_twice"] += len(queries) == 2
        rest = tuple(a for a in ex.answers if a.strip().lower() != answer.lower())
        meta = {**ex.metadata, "reading": {"queries": queries, "title": title}}
        out.append(replace(ex, answers=(answer, *rest), metadata=meta))
        counts["kept"] += 1
    return out, counts
