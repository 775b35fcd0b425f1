"""Real trivia questions that a search agent can answer from the packaged Wikipedia summaries.

Most Red-Trivia questions (games, anime, sports trivia) have no answer in 10,033 Wikipedia
summaries: a model trained on them is rewarded for guessing, not for searching. This module
keeps the questions whose accepted answer the retriever actually brings back:

1. **Answerable**: some accepted answer appears, as whole words after SQuAD normalization, in
   the top-k passages that a search with the question itself returns (k = `topk`, the agent's
   own k). Answers shorter than two characters after normalization never count (a lone digit
   or letter appears in almost any passage).
2. **Not given away**: no accepted answer appears in the question (otherwise repeating the
   question's entity, the failure the warm start showed, would be rewarded).
3. **Once**: a question asked again (same normalized text, in any list) is kept the first time.

Whole lists (`transfer_lists`) are held out as a transfer test: never trained or selected on,
and no question of theirs appears in the other splits. The rest is split by question, per
list (so every list is in every split in proportion), into train / dev / test with a seed.
The result is a folder of FlashRAG jsonl files (`train`, `dev`, `test`, `transfer`) and
`counts.json` (the settings and every list's counts), written whole or not at all.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from llds.config.schema import Invalid, section
from llds.data.example import QAExample
from llds.env.rewards import normalize_answer
from llds.retrieval.base import Retriever

SPLITS = ("train", "dev", "test", "transfer")
MIN_ANSWER_CHARS = 2
"""normalized answers shorter than this never count as found (see rule 1)"""
DEFAULT_TRANSFER = ("computers", "greekmyth", "nba", "sports")
"""lists held out whole: domains the training lists do not cover, each with answerable
questions (BM25 top-3 over the summaries)"""


@section
class TriviaWikiConfig:
    """`llds trivia-wiki`: filter and split the Red-Trivia lists against the Wikipedia
    summaries."""

    out: str = ""
    """output folder: train/dev/test/transfer.jsonl and counts.json (replaced whole); required"""
    retriever: str | None = None
    """index directory or service URL to search with (the agent's); null: BM25 over the packaged
    Wikipedia summaries, as `llds index --wiki` builds it"""
    topk: int = Field(default=3, ge=1)
    """passages per search, as the agent gets them"""
    lists: tuple[str, ...] = ()
    """Red-Trivia lists to draw from; empty: every list"""
    transfer_lists: tuple[str, ...] = DEFAULT_TRANSFER
    """lists held out whole as a transfer test"""
    dev_share: float = Field(default=0.1, ge=0, lt=1)
    """share of each list's kept questions in dev"""
    test_share: float = Field(default=0.15, ge=0, lt=1)
    """share of each list's kept questions in test"""
    seed: int = 0
    """shuffle seed of the split"""

    def __post_init__(self) -> None:
        if self.dev_share + self.test_share >= 1:
            raise Invalid("test_share", "dev_share + test_share must leave questions to train on")

    def missing(self) -> list[tuple[str, str]]:
        """Required keys left empty."""
        return [("out", "required (the output folder)")] if not self.out else []


def contains_words(text: str, phrase: str) -> bool:
    """Whether normalized `phrase` occurs in normalized `text` as whole words."""
    return f" {phrase} " in f" {text} "


def found_answers(answers: Sequence[str], text: str) -> list[str]:
    """The accepted answers (normalized, at least `MIN_ANSWER_CHARS` long) in `text`."""
    norm = normalize_answer(text)
    out = []
    for answer in answers:
        a = normalize_answer(answer)
        if len(a) >= MIN_ANSWER_CHARS and contains_words(norm, a):
            out.append(a)
    return out


def list_of(example: QAExample) -> str:
    """The Red-Trivia list a question comes from."""
    return str(example.metadata.get("list") or example.id.split(":")[1])


@dataclass
class TriviaWiki:
    """The kept questions per split and every list's counts."""

    splits: dict[str, list[QAExample]]
    counts: dict[str, dict[str, int]]
    settings: dict[str, Any] = field(default_factory=dict)

    def totals(self) -> dict[str, int]:
        return {name: len(rows) for name, rows in self.splits.items()}


def build_trivia_wiki(
    examples: Sequence[QAExample], retriever: Retriever, cfg: TriviaWikiConfig
) -> TriviaWiki:
    """Filter `examples` by the three rules of the module docstring and split them."""
    hits = retriever.search([ex.question for ex in examples], cfg.topk)
    counts: dict[str, Counter] = {}
    kept: list[QAExample] = []
    transfer_questions = {
        normalize_answer(ex.question) for ex in examples if list_of(ex) in cfg.transfer_lists
    }
    seen: set[str] = set()
    for ex, found in zip(examples, hits, strict=True):
        name = list_of(ex)
        c = counts.setdefault(name, Counter())
        c["questions"] += 1
        if not found_answers(ex.answers, " ".join(h.contents for h in found)):
            continue
        c["answerable"] += 1
        if found_answers(ex.answers, ex.question):
            c["answer_in_question"] += 1
            continue
        key = normalize_answer(ex.question)
        if key in seen or (name not in cfg.transfer_lists and key in transfer_questions):
            c["repeated"] += 1
            continue
        seen.add(key)
        c["kept"] += 1
        kept.append(ex)
    splits = split_by_list(kept, cfg)
    for split, rows in splits.items():
        for ex in rows:
            counts[list_of(ex)][split] += 1
    table = {
        name: {
            k: c[k]
            for k in ("questions", "answerable", "answer_in_question", "repeated", "kept", *SPLITS)
        }
        for name, c in sorted(counts.items())
    }
    settings = {
        "topk": cfg.topk,
        "lists": list(cfg.lists) or "all",
        "transfer_lists": list(cfg.transfer_lists),
        "dev_share": cfg.dev_share,
        "test_share": cfg.test_share,
        "seed": cfg.seed,
        "retriever": cfg.retriever or "bm25 over the packaged Wikipedia summaries",
        "min_answer_chars": MIN_ANSWER_CHARS,
    }
    return TriviaWiki(splits, table, settings)


def split_by_list(kept: Sequence[QAExample], cfg: TriviaWikiConfig) -> dict[str, list[QAExample]]:
    """Transfer lists whole; every other list shuffled (seeded by the seed and the list's name)
    and cut into test, dev and train by the shares, rounded down (train gets the rest)."""
    splits: dict[str, list[QAExample]] = {name: [] for name in SPLITS}
    by_list: dict[str, list[QAExample]] = {}
    for ex in kept:
        by_list.setdefault(list_of(ex), []).append(ex)
    for name, rows in sorted(by_list.items()):
        if name in cfg.transfer_lists:
            splits["transfer"].extend(rows)
            continue
        rows = sorted(rows, key=lambda ex: ex.id)  # the input's order does not matter
        random.Random(f"{cfg.seed}:{name}").shuffle(rows)
        n_test, n_dev = int(len(rows) * cfg.test_share), int(len(rows) * cfg.dev_share)
        splits["test"].extend(rows[:n_test])
        splits["dev"].extend(rows[n_test : n_test + n_dev])
        splits["train"].extend(rows[n_test + n_dev :])
    return splits


def write_trivia_wiki(result: TriviaWiki, out: str | Path) -> dict[str, Path]:
    """The splits as FlashRAG jsonl and `counts.json`, replacing folder `out` whole."""
    from llds.data.world import flashrag_row
    from llds.io import atomic_directory, write_json, write_jsonl

    final = Path(out)
    with atomic_directory(final) as tmp:
        for name, rows in result.splits.items():
            write_jsonl(tmp / f"{name}.jsonl", (flashrag_row(ex) for ex in rows))
        write_json(
            tmp / "counts.json",
            {
                "format": "llds-trivia-wiki/1",
                "settings": result.settings,
                "totals": result.totals(),
                "lists": result.counts,
            },
        )
    return {name: final / f"{name}.jsonl" for name in SPLITS} | {"counts": final / "counts.json"}
