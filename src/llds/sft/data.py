"""Expert search trajectories for supervised warm-up, laid out token for token like a rollout.

A trajectory is what the rollout engine would have produced had the policy been an expert: the
prompt ids from `build_prompt_ids`, then per hop one action (`<think> ... </think>` +
`<search> query </search>`) followed by the observation the retriever really returns for that
query, then a final `<think> ... </think>` + `<answer> ... </answer>` action. Every action and every
observation is tokenized on its own (no special tokens) and the pieces are concatenated, exactly as
the engine appends sampled action ids and separately tokenized observations. The loss mask is 1 on
action tokens only, so SFT trains the same tokens GRPO will later train.

Where the hops come from:

* Synthetic-world questions carry `metadata["chain"]`, a list of `{"query", "answer", ...}` hops;
  the expert searches each hop's query and answers with the example's first gold answer.
* Real QA data has no chain. The expert then makes one search with the question text itself and
  answers with the first gold answer, and the example is kept only when the retrieved passages
  contain one of the gold answers (SQuAD-normalized substring): trajectories whose evidence does
  not support the answer would teach the model to answer from nowhere.

With `reading`, the real-QA expert reads: its answer is the span as the passage writes it (not the
question's wording, not an alias from the answer list), its last thought names the passage it
read, and with `miss_first` a share of the questions first get a short search that misses (a
few words of the question, checked against the retriever), then a search with the whole
question: a warm start that has seen a search fail and a second one succeed.

With `early_answer`, a share of the chain examples is laid out as a hasty demonstrator would do
them (`early_answer_variant`): fewer searches, then the last name read as the answer. A warm start
from such data searches well but not always, which leaves RL a behaviour to learn.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from llds.data.example import QAExample
from llds.env.observation import information_block
from llds.env.prompts import PromptTemplate, build_prompt_ids
from llds.env.rewards import normalize_answer
from llds.env.tags import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    SEARCH_CLOSE,
    SEARCH_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
)
from llds.errors import DataFormatError
from llds.retrieval.base import Hit, Retriever

# Our own short reasoning phrases; one is drawn per action by a per-example seeded RNG, so the
# model sees a little surface variety but the same example always gives the same trajectory.
_FIRST_SEARCH = (
    "I need to find the {query}.",
    "I should look up the {query}.",
    "To answer, I first need the {query}.",
)
_NEXT_SEARCH = (
    "The {prev_query} is {prev_answer}. Next I need the {query}.",
    "So the {prev_query} is {prev_answer}. Now I look up the {query}.",
    "I found that the {prev_query} is {prev_answer}. I still need the {query}.",
)
_FINAL_FROM_CHAIN = (
    "The {prev_query} is {answer}, so that is the answer.",
    "I found that the {prev_query} is {answer}.",
    "The passage says the {prev_query} is {answer}.",
)
_QUESTION_SEARCH = (
    "I need to search for this question.",
    "I do not know this yet, so I will search.",
    "Let me look this up.",
)
_FINAL_FROM_QUESTION = (
    "The passages say the answer is {answer}.",
    "According to the results, the answer is {answer}.",
    "The retrieved text points to {answer}.",
)

_GUESS = (
    "I think the answer is {answer}.",
    "It should be {answer}.",
)
_SEARCH_AGAIN = (
    "The passages do not mention it. I will search the whole question.",
    "Nothing here answers it. Let me search the full question.",
    "These passages miss it. I will try the question itself.",
)
_FINAL_FROM_PASSAGE = (
    "The passage on {title} says {answer}.",
    "The {title} passage gives {answer}.",
    "According to the passage about {title}, the answer is {answer}.",
)

# Everything the expert writes besides names: fit a small tokenizer on it too.
EXPERT_PHRASES: tuple[str, ...] = (
    *_FIRST_SEARCH,
    *_NEXT_SEARCH,
    *_FINAL_FROM_CHAIN,
    *_QUESTION_SEARCH,
    *_FINAL_FROM_QUESTION,
    *_GUESS,
)

# The paraphrase bank: each reasoning step is a run of slots, each slot a set of interchangeable
# short phrasings ("" = the slot is left out), all drawn independently per trajectory. A model
# trained on it has many equally likely continuations at every slot, so its thinking text
# carries real entropy spread over many tokens, as a pretrained model's does, instead of one
# memorized line. Slots are a few words each so that the entropy per model token stays high.
_OPENERS = ("", "Okay.", "Hmm.", "Right.", "Well.", "So.", "Now.", "Good.")
_NEED = ("I need to", "I should", "I must", "I want to", "I have to", "I will", "Let me", "I can")
_LOOKUP = ("find", "look up", "search for", "check", "learn", "get", "read about", "ask about")
_WHY = ("", "to answer", "for this", "first of all", "to go on", "as a start", "to be sure", "now")
_CLOSERS = (
    "",
    "A search will tell me.",
    "The passages will say.",
    "Then I can go on.",
    "That comes first.",
    "Search it.",
    "Let me see.",
    "Here goes.",
)
_READ = ("The", "So the", "I see the", "Now the", "I read that the", "It seems the", "Yes, the")
_NEXT = ("Next", "Now", "Then", "After that", "Still,", "Also", "So", "From there")
_CONCLUDE = (
    "",
    "That is the answer.",
    "So that is it.",
    "Done.",
    "I can answer now.",
    "That answers it.",
    "Enough searching.",
    "The answer is clear.",
)
_SEARCH_TAIL = (_NEED, _LOOKUP, ("the {query}",), _WHY, (".",), _CLOSERS)
PARAPHRASE_SLOTS: dict[str, tuple[tuple[str, ...], ...]] = {
    "first_search": (_OPENERS, *_SEARCH_TAIL),
    "next_search": (_OPENERS, _READ, ("{prev_query} is {prev_answer}.",), _NEXT, *_SEARCH_TAIL),
    "final_from_chain": (_OPENERS, _READ, ("{prev_query} is {answer}.",), _CONCLUDE),
    "question_search": (_OPENERS, _QUESTION_SEARCH, _CLOSERS),
    "final_from_question": (_OPENERS, _FINAL_FROM_QUESTION, _CONCLUDE),
    "guess": (_OPENERS, _GUESS, _CONCLUDE),
}
"""slots of each reasoning step in the `paraphrase` bank"""
READING_SLOTS: dict[str, tuple[tuple[str, ...], ...]] = {
    "search_again": (
        _OPENERS,
        ("The passages do not say.", "Nothing here answers it.", "These passages miss it."),
        _NEED,
        _LOOKUP,
        ("the whole question", "the full question", "the question itself"),
        (".",),
        _CLOSERS,
    ),
    "final_from_passage": (
        _OPENERS,
        ("The passage on {title} says", "The {title} passage gives", "Reading about {title}:"),
        ("{answer}.",),
        _CONCLUDE,
    ),
}
"""the reading expert's steps in the paraphrase banks (kept apart: a bank's phrase list, which
small tokenizers are fitted on, is what it was before the reading expert existed)"""

# The `paraphrase-wide` bank: every free slot of `paraphrase` with as many phrasings again (one
# or two words each, so each slot stays a token or two). About 0.7 more nats per slot at the
# same length: a perfect imitator keeps more entropy per action token, so a warm start can learn
# to read and answer before its thinking text runs out of uncertainty.
_MORE: dict[tuple[str, ...], tuple[str, ...]] = {
    _OPENERS: ("Alright.", "Sure.", "Fine.", "Yes.", "Ah.", "Oh.", "Look.", "Great."),
    _NEED: (
        "I ought to",
        "I shall",
        "I'll",
        "Time to",
        "Best to",
        "I plan to",
        "I mean to",
        "I try to",
    ),
    _LOOKUP: ("query", "seek", "confirm", "verify", "retrieve", "discover", "pin down", "work out"),
    _WHY: ("here", "first", "next", "quickly", "today", "again", "carefully", "at once"),
    _CLOSERS: (
        "Go.",
        "On it.",
        "Searching.",
        "Off I go.",
        "Easy.",
        "Simple.",
        "We will see.",
        "One search.",
    ),
    _READ: (
        "Clearly the",
        "Apparently the",
        "Good, the",
        "OK, the",
        "Noted: the",
        "Aha, the",
        "Indeed the",
        "Great, the",
        "Evidently the",
    ),
    _NEXT: ("Later", "Second", "Further", "And now", "Moving on", "Onward", "Besides", "Meanwhile"),
    _CONCLUDE: (
        "Finished.",
        "All set.",
        "Got it.",
        "That settles it.",
        "Answer found.",
        "Solved.",
        "No more searching.",
        "Clear now.",
    ),
}
WIDE_SLOTS: dict[str, tuple[tuple[str, ...], ...]] = {
    step: tuple(slot + _MORE.get(slot, ()) for slot in slots)
    for step, slots in PARAPHRASE_SLOTS.items()
}
"""slots of each reasoning step in the `paraphrase-wide` bank"""


def _slot_phrases(slots_by_step: dict[str, tuple[tuple[str, ...], ...]]) -> tuple[str, ...]:
    return tuple(
        dict.fromkeys(p for slots in slots_by_step.values() for slot in slots for p in slot if p)
    )


PARAPHRASE_PHRASES: tuple[str, ...] = _slot_phrases(PARAPHRASE_SLOTS)
"""everything the paraphrase bank can write besides names (for fitting a tokenizer)"""
WIDE_PHRASES: tuple[str, ...] = _slot_phrases(WIDE_SLOTS)
"""everything the paraphrase-wide bank can write besides names"""
_FIXED_STEPS = {
    "first_search": _FIRST_SEARCH,
    "next_search": _NEXT_SEARCH,
    "final_from_chain": _FINAL_FROM_CHAIN,
    "question_search": _QUESTION_SEARCH,
    "final_from_question": _FINAL_FROM_QUESTION,
    "guess": _GUESS,
}
_READING_FIXED = {"search_again": _SEARCH_AGAIN, "final_from_passage": _FINAL_FROM_PASSAGE}
READING_PHRASES: tuple[str, ...] = (
    *_SEARCH_AGAIN,
    *_FINAL_FROM_PASSAGE,
    *_slot_phrases(READING_SLOTS),
)
"""everything the reading expert writes besides names, in every bank (for fitting a small
tokenizer that will see it: `tokenizer_phrases(bank, reading=True)`)"""
ThinkBank = Literal["fixed", "paraphrase", "paraphrase-wide"]
_SLOTS: dict[str, dict[str, tuple[tuple[str, ...], ...]]] = {
    "fixed": {step: (phrasings,) for step, phrasings in {**_FIXED_STEPS, **_READING_FIXED}.items()},
    "paraphrase": {**PARAPHRASE_SLOTS, **READING_SLOTS},
    "paraphrase-wide": {**WIDE_SLOTS, **READING_SLOTS},
}
_PHRASES: dict[str, tuple[str, ...]] = {
    "fixed": EXPERT_PHRASES,
    "paraphrase": PARAPHRASE_PHRASES,
    "paraphrase-wide": WIDE_PHRASES,
}


TOKENIZER_REPEATS = 30
"""how often a small tokenizer sees each paraphrase-bank phrase: the expert writes them in every
trajectory, and seen once each they would be cut into single letters"""


def bank_phrases(bank: ThinkBank) -> tuple[str, ...]:
    """The phrasings a bank can write."""
    return _PHRASES[bank]


def tokenizer_phrases(bank: ThinkBank, *, reading: bool = False) -> list[str]:
    """The bank's phrasings as a small tokenizer should see them: the paraphrase bank's
    `TOKENIZER_REPEATS` times, each after a space as the expert writes it; with `reading`, the
    reading expert's too."""
    extra = list(READING_PHRASES) if reading else []
    if bank == "fixed":
        return [*EXPERT_PHRASES, *extra]
    return [f" {p}" for p in (*_PHRASES[bank], *extra)] * TOKENIZER_REPEATS


def step_entropy(step: str, bank: ThinkBank = "fixed") -> float:
    """Entropy in nats of one reasoning step's draw: every slot is a uniform choice."""
    return sum(math.log(len(set(slot))) for slot in _SLOTS[bank][step])


def think_entropy(example: QAExample, bank: ThinkBank = "fixed") -> float:
    """Entropy in nats of the expert's whole thinking text for `example`: what a perfect
    imitator of the expert would still be uncertain about (names and queries are determined)."""
    chain = _chain(example)
    plan = _reading(example)
    if plan is not None:
        steps = ["question_search", *["search_again"] * (len(plan["queries"]) - 1)]
        steps.append("final_from_passage")
    elif chain is None:
        steps = ["question_search", "final_from_question"]
    else:
        steps = ["first_search"] + ["next_search"] * (len(chain) - 1)
        steps.append("final_from_chain" if chain else "guess")
    return sum(step_entropy(step, bank) for step in steps)


def think_text(step: str, rng: random.Random, bank: ThinkBank = "fixed", **refs: str) -> str:
    """One reasoning step's text: a phrasing drawn from the `fixed` bank (three per step), or
    one draw per slot of a paraphrase bank joined by spaces."""
    if bank == "fixed":
        return rng.choice({**_FIXED_STEPS, **_READING_FIXED}[step]).format(**refs)
    picks = (rng.choice(slot) for slot in _SLOTS[bank][step])
    return " ".join(p for p in picks if p).replace(" .", ".").format(**refs)


@dataclass(frozen=True)
class ExpertEpisode:
    """One teacher-forced trajectory: `input_ids` = prompt + response, `loss_mask` aligned to it.

    `loss_mask` is 1 exactly on the model-written action tokens and 0 on the prompt and on every
    observation. `action_texts` / `observations` are the text pieces in order (action 0,
    observation 0, action 1, ..., final action), kept for inspection and tests.
    """

    example_id: str
    input_ids: list[int]
    loss_mask: list[int]
    prompt_len: int
    hops: int
    action_texts: tuple[str, ...]
    observations: tuple[str, ...]
    queries: tuple[str, ...]
    answer: str
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def prompt_ids(self) -> list[int]:
        return self.input_ids[: self.prompt_len]

    @property
    def response_ids(self) -> list[int]:
        return self.input_ids[self.prompt_len :]

    @property
    def response_mask(self) -> list[int]:
        """`loss_mask` over the response only (the rollout engine's `action_mask`)."""
        return self.loss_mask[self.prompt_len :]

    @property
    def num_action_tokens(self) -> int:
        return sum(self.loss_mask)

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class ExpertDataStats:
    """What `build_expert_episodes` kept and why it dropped the rest."""

    considered: int = 0
    kept: int = 0
    skipped_hops: int = 0
    skipped_no_gold_in_retrieval: int = 0
    early_answers: int = 0
    searched_twice: int = 0
    kept_by_hops: dict[int, int] = field(default_factory=dict)

    def merged(self, other: ExpertDataStats) -> ExpertDataStats:
        """The counts of both (e.g. a world and its relabeled copies)."""
        hops = dict(self.kept_by_hops)
        for h, n in other.kept_by_hops.items():
            hops[h] = hops.get(h, 0) + n
        return ExpertDataStats(
            considered=self.considered + other.considered,
            kept=self.kept + other.kept,
            skipped_hops=self.skipped_hops + other.skipped_hops,
            skipped_no_gold_in_retrieval=self.skipped_no_gold_in_retrieval
            + other.skipped_no_gold_in_retrieval,
            early_answers=self.early_answers + other.early_answers,
            searched_twice=self.searched_twice + other.searched_twice,
            kept_by_hops=hops,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "considered": self.considered,
            "kept": self.kept,
            "skipped_hops": self.skipped_hops,
            "skipped_no_gold_in_retrieval": self.skipped_no_gold_in_retrieval,
            "early_answers": self.early_answers,
            "searched_twice": self.searched_twice,
            "kept_by_hops": {str(h): n for h, n in sorted(self.kept_by_hops.items())},
        }


def _tokens(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _action(think: str, tag_open: str, content: str, tag_close: str) -> str:
    return f"{THINK_OPEN} {think} {THINK_CLOSE}\n{tag_open} {content} {tag_close}"


def _chain(example: QAExample) -> list[dict[str, Any]] | None:
    """The example's hop chain, validated; None when it has none (real QA data)."""
    chain = example.metadata.get("chain") if example.metadata else None
    if chain is None:
        return None
    if not isinstance(chain, list) or not (chain or example.metadata.get("early_answer")):
        raise DataFormatError(f"example {example.id}: metadata.chain must be a non-empty list")
    for i, hop in enumerate(chain):
        if not isinstance(hop, dict) or not all(
            isinstance(hop.get(key), str) and hop[key].strip() for key in ("query", "answer")
        ):
            raise DataFormatError(
                f"example {example.id}: metadata.chain[{i}] needs non-empty 'query' and 'answer'"
            )
    return chain


def _reading(example: QAExample) -> dict[str, Any] | None:
    """The reading plan `reading_example` attached (queries, the passage's title), or None."""
    return example.metadata.get("reading") if example.metadata else None


def expert_hops(example: QAExample) -> int:
    """Number of searches the expert makes: the chain length, or 1 for real QA."""
    plan, chain = _reading(example), _chain(example)
    if plan is not None:
        return len(plan["queries"])
    return 1 if chain is None else len(chain)


def expert_queries(example: QAExample) -> list[str]:
    """The expert's search queries, in order."""
    plan, chain = _reading(example), _chain(example)
    if plan is not None:
        return list(plan["queries"])
    return [example.question.strip()] if chain is None else [h["query"].strip() for h in chain]


def _rng_for(example: QAExample, seed: int, draw: int = 0) -> random.Random:
    return random.Random(f"{seed}:{example.id}" + (f":{draw}" if draw else ""))


def expert_actions(
    example: QAExample,
    *,
    think: bool = True,
    seed: int = 0,
    think_bank: ThinkBank = "fixed",
    draw: int = 0,
) -> list[str]:
    """The expert's action texts: one per search, then the answer action.

    With `think=False` every action is just the search/answer span (no reasoning text);
    `think_bank` picks where the reasoning text comes from (`think_text`); `draw` numbers
    independent draws of it for the same example and seed (0 = the first).
    """
    if not example.answers:
        raise DataFormatError(f"example {example.id}: no gold answers")
    rng = _rng_for(example, seed, draw)
    answer = example.answers[0].strip()
    chain, plan = _chain(example), _reading(example)
    actions: list[str] = []
    if plan is not None:
        first, *again = plan["queries"]
        searches = [(think_text("question_search", rng, think_bank), first)]
        searches += [(think_text("search_again", rng, think_bank), q) for q in again]
        final_think = think_text(
            "final_from_passage", rng, think_bank, title=plan["title"], answer=answer
        )
    elif chain is None:
        searches = [(think_text("question_search", rng, think_bank), example.question.strip())]
        final_think = think_text("final_from_question", rng, think_bank, answer=answer)
    else:
        searches = []
        for i, hop in enumerate(chain):
            prev = chain[i - 1] if i else {}
            text = think_text(
                "first_search" if i == 0 else "next_search",
                rng,
                think_bank,
                query=hop["query"].strip(),
                prev_query=prev.get("query", "").strip(),
                prev_answer=prev.get("answer", "").strip(),
            )
            searches.append((text, hop["query"].strip()))
        final_think = (
            think_text(
                "final_from_chain",
                rng,
                think_bank,
                prev_query=chain[-1]["query"].strip(),
                answer=answer,
            )
            if chain
            else think_text("guess", rng, think_bank, answer=answer)
        )
    for reasoning, query in searches:
        if think:
            actions.append(_action(reasoning, SEARCH_OPEN, query, SEARCH_CLOSE))
        else:
            actions.append(f"{SEARCH_OPEN} {query} {SEARCH_CLOSE}")
    if think:
        actions.append(_action(final_think, ANSWER_OPEN, answer, ANSWER_CLOSE))
    else:
        actions.append(f"{ANSWER_OPEN} {answer} {ANSWER_CLOSE}")
    return actions


def early_answer_variant(example: QAExample, rng: random.Random) -> QAExample:
    """The example as a hasty demonstrator would do it: fewer searches, a wrong answer.

    For a chain of `h` hops, keep the first `j` hops (`j` uniform in 0..h-1) and answer with the
    last name the demonstrator has: the answer of hop `j`, or the question's start entity when
    `j` is 0. Every chain entity is distinct, so that answer is always wrong: the warm start then
    knows both behaviours (stop early, search on) and RL has a general decision to learn, the
    one Search-R1's models learn, rather than facts to memorize.
    """
    chain = _chain(example)
    if chain is None:
        raise DataFormatError(f"example {example.id}: early answers need metadata.chain")
    j = rng.randrange(len(chain))
    start = (example.metadata or {}).get("start") or chain[0].get("subject")
    if j == 0 and not start:
        raise DataFormatError(f"example {example.id}: early answers need metadata.start")
    answer = chain[j - 1]["answer"] if j else start
    meta = {**example.metadata, "chain": chain[:j], "early_answer": True}
    return replace(example, answers=(answer,), metadata=meta)


def retrieval_contains_gold(hits: Sequence[Hit], golds: Sequence[str]) -> bool:
    """True when some normalized gold answer is a substring of some normalized passage."""
    gold_norm = [g for g in (normalize_answer(x) for x in golds) if g]
    return any(g in normalize_answer(h.contents) for h in hits for g in gold_norm)


def assemble_episode(
    example: QAExample,
    hits_per_search: Sequence[Sequence[Hit]],
    tokenizer: Any,
    *,
    template: PromptTemplate | str | None = None,
    chat: bool | None = None,
    max_obs_tokens: int = 500,
    think: bool = True,
    seed: int = 0,
    think_bank: ThinkBank = "fixed",
    draw: int = 0,
) -> ExpertEpisode:
    """Lay out the expert trajectory given the retriever's hits for each of its searches."""
    actions = expert_actions(example, think=think, seed=seed, think_bank=think_bank, draw=draw)
    queries = expert_queries(example)
    if len(hits_per_search) != len(queries):
        raise ValueError(
            f"example {example.id}: {len(queries)} searches but {len(hits_per_search)} hit lists"
        )
    prompt = build_prompt_ids(tokenizer, example.question, template, chat=chat)
    ids, mask = list(prompt), [0] * len(prompt)
    observations: list[str] = []
    for action, hits in zip(actions[:-1], hits_per_search, strict=True):
        action_ids = _tokens(tokenizer, action)
        ids += action_ids
        mask += [1] * len(action_ids)
        block = information_block(hits, tokenizer=tokenizer, max_tokens=max_obs_tokens)
        observations.append(block)
        obs_ids = _tokens(tokenizer, block)
        ids += obs_ids
        mask += [0] * len(obs_ids)
    final_ids = _tokens(tokenizer, actions[-1])
    ids += final_ids
    mask += [1] * len(final_ids)
    return ExpertEpisode(
        example_id=example.id,
        input_ids=ids,
        loss_mask=mask,
        prompt_len=len(prompt),
        hops=len(queries),
        action_texts=tuple(actions),
        observations=tuple(observations),
        queries=tuple(queries),
        answer=example.answers[0].strip(),
        metadata={"source": example.source},
    )


def build_expert_episodes(
    examples: Sequence[QAExample],
    retriever: Retriever,
    tokenizer: Any,
    *,
    template: PromptTemplate | str | None = None,
    chat: bool | None = None,
    topk: int = 3,
    max_obs_tokens: int = 500,
    think: bool = True,
    max_hops: int | None = None,
    num_examples: int | None = None,
    early_answer: float = 0.0,
    seed: int = 0,
    think_bank: ThinkBank = "fixed",
    think_draws: int = 1,
    reading: bool = False,
    miss_first: float = 0.0,
) -> tuple[list[ExpertEpisode], ExpertDataStats]:
    """Expert trajectories for many examples, with all searches sent to the retriever at once.

    `max_hops` drops examples that need more searches (e.g. 1 = warm up on single-hop only, so
    multi-hop is left for RL to learn); `num_examples` caps how many examples are kept (in
    input order). Both are the knobs for how much the warm start teaches. `early_answer` is the
    share of chain examples replaced by their `early_answer_variant` (chosen per example, seeded).
    `think_draws` lays out each kept example that many times, each with its own draw of the
    thinking text (the same searches and passages): with one draw per question, a model trained
    for many epochs memorizes which phrasing goes with which question and loses the bank's
    entropy. `reading` (real QA only) makes the expert read (`llds.sft.reading`): the passage's
    span as the answer, the passage named, and with `miss_first` that share of the questions
    searched twice, a short search that misses first.
    """
    if not 0.0 <= early_answer <= 1.0:
        raise ValueError(f"early_answer must be in [0, 1], got {early_answer}")
    if think_draws < 1:
        raise ValueError(f"think_draws must be at least 1, got {think_draws}")
    stats = ExpertDataStats(considered=len(examples))
    if reading:
        from llds.sft.reading import reading_examples

        if any(_chain(ex) is not None for ex in examples):
            raise DataFormatError("reading=true is for real QA: these examples carry hop chains")
        examples, counts = reading_examples(
            examples, retriever, topk=topk, miss_first=miss_first, seed=seed
        )
        stats.skipped_no_gold_in_retrieval += counts["no_span"]
        stats.searched_twice += counts["searched_twice"]
    chosen: list[QAExample] = []
    for ex in examples:
        if max_hops is not None and expert_hops(ex) > max_hops:
            stats.skipped_hops += 1
            continue
        if early_answer and _chain(ex) is not None:
            rng = random.Random(f"early:{seed}:{ex.id}")
            if rng.random() < early_answer:
                ex = early_answer_variant(ex, rng)
                stats.early_answers += 1
        chosen.append(ex)
    flat: list[str] = []
    spans: list[tuple[int, int]] = []
    for ex in chosen:
        queries = expert_queries(ex)
        spans.append((len(flat), len(flat) + len(queries)))
        flat.extend(queries)
    results = retriever.search(flat, topk) if flat else []
    episodes: list[ExpertEpisode] = []
    for ex, (lo, hi) in zip(chosen, spans, strict=True):
        if num_examples is not None and stats.kept >= num_examples:
            break
        hits = results[lo:hi]
        if _chain(ex) is None and not retrieval_contains_gold(hits[-1], ex.answers):
            stats.skipped_no_gold_in_retrieval += 1
            continue
        for draw in range(think_draws):
            ep = assemble_episode(
                ex,
                hits,
                tokenizer,
                template=template,
                chat=chat,
                max_obs_tokens=max_obs_tokens,
                think=think,
                seed=seed,
                think_bank=think_bank,
                draw=draw,
            )
            episodes.append(ep)
        stats.kept += 1
        stats.kept_by_hops[ep.hops] = stats.kept_by_hops.get(ep.hops, 0) + 1
    return episodes, stats
