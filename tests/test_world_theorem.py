"""The theorem world and warm start: names from a small shared syllable set that span several
model tokens and share pieces across right and wrong answers; a paraphrase bank whose thinking
text has many equally likely continuations; the presets that put them together."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from llds.data.world import WorldConfig, generate_world
from llds.errors import ConfigError
from llds.models.bpe import tokenizer_for_world
from llds.retrieval.factory import build_retriever
from llds.sft.config import load_sft_config
from llds.sft.data import (
    EXPERT_PHRASES,
    PARAPHRASE_PHRASES,
    PARAPHRASE_SLOTS,
    WIDE_PHRASES,
    WIDE_SLOTS,
    bank_phrases,
    build_expert_episodes,
    expert_actions,
    step_entropy,
    think_entropy,
    think_text,
    tokenizer_phrases,
)


@pytest.fixture(scope="module")
def theorem_world():
    return generate_world(WorldConfig.preset("theorem"))


def test_closed_inventory_builds_every_name_from_few_shared_syllables():
    world = generate_world(
        WorldConfig(syllable_inventory=8, name_length=3, num_entities=60, num_train=40, num_test=8)
    )
    pieces = Counter(s for e in world.entities for s in e.syllables)
    assert len(pieces) <= 8
    assert all(len(e.syllables) == 3 for e in world.entities)
    assert all(e.name.lower() == "".join(e.syllables) for e in world.entities)
    names = [e.name for e in world.entities]
    assert len(set(names)) == len(names)
    # every syllable is reused by many names: that is what makes answers share pieces
    assert min(pieces.values()) >= 5


def test_open_inventory_is_the_default_world():
    plain = generate_world(WorldConfig(num_entities=60, num_train=40, num_test=8))
    explicit = generate_world(
        WorldConfig(syllable_inventory=0, name_length=0, num_entities=60, num_train=40, num_test=8)
    )
    assert [e.name for e in plain.entities] == [e.name for e in explicit.entities]
    assert plain.corpus == explicit.corpus
    assert {len(e.syllables) for e in plain.entities} <= {2, 3}
    # open names rarely repeat a syllable; the closed world's always do
    pieces = Counter(s for e in plain.entities for s in e.syllables)
    assert len(pieces) > 40


@pytest.mark.parametrize("size", [1, 3])
def test_too_small_an_inventory_is_refused(size):
    with pytest.raises((ConfigError, ValueError), match="syllable_inventory"):
        WorldConfig(syllable_inventory=size)


def test_theorem_answers_span_several_tokens_shared_with_wrong_answers(theorem_world):
    vocab = load_sft_config("sft-theorem", ["out=x"]).tokenizer_vocab
    tok = tokenizer_for_world(theorem_world, vocab, extra_texts=tokenizer_phrases("paraphrase"))

    def pieces(name: str) -> list[int]:
        return tok(" " + name, add_special_tokens=False)["input_ids"]

    lengths = [len(pieces(e.name)) for e in theorem_world.entities]
    assert min(lengths) >= 2 and sum(lengths) / len(lengths) >= 2.2
    by_type: dict[str, list[set[int]]] = {}
    for e in theorem_world.entities:
        by_type.setdefault(e.type, []).append(set(pieces(e.name)))
    types = {e.name: e.type for e in theorem_world.entities}
    for ex in theorem_world.test[:50]:
        gold = set(pieces(ex.answers[0]))
        rivals = [p for p in by_type[types[ex.answers[0]]] if p != gold]
        # some wrong answer of the same type shares a model token with the right one
        assert any(gold & p for p in rivals), ex.answers[0]


def test_theorem_expert_queries_still_find_their_passage(theorem_world):
    retriever = build_retriever(theorem_world.corpus, show_progress=False)
    hops = [hop for ex in theorem_world.train[:60] for hop in ex.metadata["chain"]]
    hits = retriever.search([h["query"] for h in hops], 1)
    top = [h[0].id for h in hits]
    assert sum(t == h["doc_id"] for t, h in zip(top, hops, strict=True)) / len(hops) >= 0.95


def test_paraphrase_bank_draws_many_equally_likely_phrasings():
    texts = [
        think_text("first_search", random.Random(i), "paraphrase", query="capital of Xo")
        for i in range(4000)
    ]
    counts = Counter(texts)
    # tens of thousands of phrasings: 4000 draws almost never repeat one
    assert len(counts) > 0.9 * len(texts) and max(counts.values()) <= 3
    assert all("capital of Xo" in t and " ." not in t for t in texts)
    # each slot's options are drawn about equally often
    openers = Counter(t.split()[0] for t in texts if t.split()[0].endswith("."))
    assert len(openers) == 7 and max(openers.values()) < 1.4 * min(openers.values())
    fixed = {t.format(query="capital of Xo") for t in EXPERT_PHRASES[:3]}
    drawn = {think_text("first_search", random.Random(i), query="capital of Xo") for i in range(50)}
    assert drawn == fixed


def test_think_entropy_adds_up_the_steps_of_a_chain(theorem_world):
    ex = next(e for e in theorem_world.train if e.metadata["hops"] == 3)
    steps = ("first_search", "next_search", "next_search", "final_from_chain")
    expected = sum(step_entropy(s, "paraphrase") for s in steps)
    assert think_entropy(ex, "paraphrase") == pytest.approx(expected)
    assert think_entropy(ex) == pytest.approx(4 * math.log(3))
    assert step_entropy("first_search", "paraphrase") > 8 > step_entropy("first_search")


def test_tokenizer_sees_bank_words_whole(theorem_world):
    tok = tokenizer_for_world(theorem_world, 800, extra_texts=tokenizer_phrases("paraphrase"))
    for word in (" look", " passages", " sure", " answer"):
        assert len(tok(word, add_special_tokens=False)["input_ids"]) == 1, word
    assert tokenizer_phrases("fixed") == list(EXPERT_PHRASES)


def test_expert_actions_use_the_chosen_bank(theorem_world):
    ex = next(e for e in theorem_world.train if e.metadata["hops"] == 2)
    fixed = expert_actions(ex, seed=0)
    para = expert_actions(ex, seed=0, think_bank="paraphrase")
    assert para == expert_actions(ex, seed=0, think_bank="paraphrase")  # one draw per trajectory
    assert len(para) == len(fixed) == 3
    assert [a.split("<search>")[-1] for a in para[:2]] == [
        a.split("<search>")[-1] for a in fixed[:2]
    ]
    variants = {expert_actions(ex, seed=s, think_bank="paraphrase")[1] for s in range(40)}
    assert len(variants) >= 20
    assert (
        bank_phrases("fixed") == EXPERT_PHRASES and bank_phrases("paraphrase") == PARAPHRASE_PHRASES
    )


def test_sft_theorem_preset_trains_on_actions_with_the_bank():
    cfg = load_sft_config("sft-theorem", ["out=x"])
    assert cfg.loss_on == "actions" and cfg.think and cfg.think_bank == "paraphrase-wide"
    assert cfg.think_draws == 8
    assert not cfg.name_tokens and cfg.relabel_copies == 0
    default = load_sft_config(None, ["out=x"])
    assert default.think_bank == "fixed" and default.think_draws == 1
    with pytest.raises(ConfigError, match="think_draws"):
        load_sft_config(None, ["out=x", "think_draws=0"])


def test_wide_bank_keeps_every_paraphrase_slot_and_doubles_the_free_ones():
    for step, slots in PARAPHRASE_SLOTS.items():
        wide = WIDE_SLOTS[step]
        assert len(wide) == len(slots)
        for narrow, widened in zip(slots, wide, strict=True):
            assert widened[: len(narrow)] == narrow  # the narrow bank's draws are a prefix
            if len(narrow) >= 7:  # the free slots (not the three-phrasing fixed ones)
                assert len(set(widened)) == 16, (step, narrow[:2])
    # one more bit (ln 2) per free slot: first_search has 5 free slots of 8 -> 16
    gain = step_entropy("first_search", "paraphrase-wide") - step_entropy(
        "first_search", "paraphrase"
    )
    assert gain == pytest.approx(5 * math.log(2))
    assert set(PARAPHRASE_PHRASES) < set(WIDE_PHRASES) == set(bank_phrases("paraphrase-wide"))
    assert tokenizer_phrases("paraphrase-wide").count(" Meanwhile") == 30


def test_think_draws_lay_out_each_question_with_its_own_thinking(theorem_world):
    tok = tokenizer_for_world(theorem_world, 800, extra_texts=tokenizer_phrases("paraphrase-wide"))
    retriever = build_retriever(theorem_world.corpus, show_progress=False)
    examples = theorem_world.train[:6]
    common = {"topk": 2, "max_obs_tokens": 64, "think_bank": "paraphrase-wide", "seed": 3}
    one, stats_one = build_expert_episodes(examples, retriever, tok, **common)
    four, stats_four = build_expert_episodes(examples, retriever, tok, think_draws=4, **common)
    assert len(one) == 6 and len(four) == 24 and stats_one.kept == stats_four.kept == 6
    assert [e.action_texts for e in four[::4]] == [e.action_texts for e in one]  # draw 0 = before
    for i in range(6):
        draws = four[4 * i : 4 * i + 4]
        assert len({e.example_id for e in draws}) == 1
        assert len({e.action_texts for e in draws}) == 4  # each its own thinking text
        assert len({e.queries for e in draws}) == 1 and len({e.observations for e in draws}) == 1
    with pytest.raises(ValueError, match="think_draws"):
        build_expert_episodes(examples, retriever, tok, think_draws=0, **common)
