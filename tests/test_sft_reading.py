"""The reading expert: the passage's own span, the passage named, a first search that misses."""

from __future__ import annotations

import pytest

from llds.data.example import QAExample
from llds.env import extract_answer, is_valid_sequence
from llds.errors import ConfigError
from llds.models import train_bpe_tokenizer
from llds.retrieval.base import Hit
from llds.retrieval.bm25 import BM25Retriever
from llds.sft.config import load_sft_config
from llds.sft.data import EXPERT_PHRASES, build_expert_episodes, think_entropy
from llds.sft.reading import partial_queries, passage_span, reading_examples

CORPUS = [
    {
        "id": "1",
        "contents": '"Barland"\nBarland is a country in the north. Its capital is New  Quxville.',
    },
    {"id": "2", "contents": '"Zed"\nThe Zed is a long river that flows past Lom and Tarn.'},
    {"id": "3", "contents": '"Moonfall"\nMoonfall is a novel written by Ada Pell in 1901.'},
    {"id": "4", "contents": '"Tarn"\nTarn is a town with a large market and a famous clock.'},
    {"id": "5", "contents": '"Lom"\nLom is a port city known for its bridges and its fish.'},
]
QUESTIONS = [
    QAExample("q:0", "What is the capital city of the country Barland?", ("new quxville",), "t"),
    QAExample(
        "q:1", "Which novel was written by the author Ada Pell?", ("moonfall", "Moon Fall"), "t"
    ),
    QAExample("q:2", "Which river flows past the port city of Lom?", ("Zed", "river Zed"), "t"),
    QAExample("q:3", "Who painted the famous clock tower?", ("Nobody Known",), "t"),
]


@pytest.fixture(scope="module")
def retriever():
    return BM25Retriever.build(CORPUS, show_progress=False)


@pytest.fixture(scope="module")
def tokenizer():
    texts = [d["contents"] for d in CORPUS] + [q.question for q in QUESTIONS]
    return train_bpe_tokenizer([*texts, *EXPERT_PHRASES], vocab_size=400)


def test_passage_span_is_written_as_the_passage_writes_it():
    hits = [Hit("2", CORPUS[1]["contents"]), Hit("1", CORPUS[0]["contents"])]
    # the answer list writes it in lower case with one space; the passage with two and capitals
    assert passage_span(hits, ["new quxville"]) == ("Barland", "New  Quxville")
    assert passage_span(hits, ["Quxvil"]) is None  # part of a word is not the word
    # the first passage that writes an answer wins, with the first alias it writes
    assert passage_span(hits, ["Lom", "Barland"]) == ("Zed", "Lom")
    assert passage_span(hits[:1], ["river Zed", "Zed"]) == ("Zed", "Zed")


def test_partial_queries_are_a_few_words_of_the_question():
    assert partial_queries("Which river flows past Lom and Tarn?") == [
        "Lom and Tarn",
        "Which river flows past",
    ]
    assert partial_queries("Lom?") == []  # as short as the question: nothing shorter to try


def test_reading_plans_keep_spans_and_a_first_search_that_really_misses(retriever):
    plans, counts = reading_examples(QUESTIONS, retriever, topk=1, miss_first=1.0)
    assert counts == {
        "kept": 3,
        "no_span": 1,
        "searched_twice": sum(len(p.metadata["reading"]["queries"]) == 2 for p in plans),
    }
    assert counts["searched_twice"] >= 1
    by_id = {p.id: p for p in plans}
    assert by_id["q:0"].answers[0] == "New  Quxville"
    assert by_id["q:1"].answers == ("Moonfall", "Moon Fall")  # the span first, other aliases kept
    for plan in plans:
        queries = plan.metadata["reading"]["queries"]
        assert queries[-1] == plan.question
        if len(queries) == 2:  # the first search's passages hold no accepted answer
            first = retriever.search([queries[0]], 1)[0]
            assert passage_span(first, plan.answers) is None
    none, counts = reading_examples(QUESTIONS, retriever, topk=1, miss_first=0.0)
    assert counts["searched_twice"] == 0
    assert all(p.metadata["reading"]["queries"] == [p.question] for p in none)


def test_reading_episodes_search_twice_and_answer_from_the_named_passage(retriever, tokenizer):
    episodes, stats = build_expert_episodes(
        QUESTIONS, retriever, tokenizer, topk=1, reading=True, miss_first=1.0
    )
    assert stats.kept == 3 and stats.skipped_no_gold_in_retrieval == 1
    assert stats.searched_twice == sum(ep.hops == 2 for ep in episodes) >= 1
    for ep in episodes:
        text = "".join(ep.action_texts)
        assert is_valid_sequence(
            "".join(a + o for a, o in zip(ep.action_texts, (*ep.observations, ""), strict=True))
        )
        assert extract_answer(ep.action_texts[-1]) == ep.answer
        title = {"q:0": "Barland", "q:1": "Moonfall", "q:2": "Zed"}[ep.example_id]
        assert title in ep.action_texts[-1]  # the last thought names the passage read
        assert ep.answer.lower() in ep.observations[-1].lower()
        if ep.hops == 2:
            assert ep.answer.lower() not in ep.observations[0].lower()
            assert "question" in ep.action_texts[1]  # "... search the whole question"
        assert "<answer>" not in text.split("<answer>", 1)[0]
        # the loss is on the expert's tokens only: no observation token is trained
        trained = sum(ep.loss_mask)
        assert 0 < trained < len(ep.input_ids) - ep.prompt_len
    plans = reading_examples(QUESTIONS, retriever, topk=1, miss_first=1.0)[0]
    twice = next(p for p in plans if len(p.metadata["reading"]["queries"]) == 2)
    plain = next(q for q in QUESTIONS if q.id == twice.id)
    assert think_entropy(twice) > think_entropy(plain)  # one more reasoning step to draw


def test_reading_settings_that_would_do_nothing_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="miss_first"):
        load_sft_config(None, [f"out={tmp_path}", "data=q.jsonl", "miss_first=0.5"])
    with pytest.raises(ConfigError, match="reading"):
        load_sft_config(None, [f"out={tmp_path}", "world=w", "reading=true"])


def test_the_banks_phrase_lists_are_what_small_tokenizers_were_fitted_on():
    """The phrase lists a small tokenizer is fitted on are pinned: a phrase added to a bank
    changes every tiny tokenizer, hence the demo's and the theorem study's warm starts. The
    reading expert's phrasings join them only for a warm start that reads."""
    import hashlib
    import json

    from llds.sft.data import tokenizer_phrases

    digests = {
        bank: hashlib.sha256(json.dumps(tokenizer_phrases(bank)).encode()).hexdigest()[:16]
        for bank in ("fixed", "paraphrase", "paraphrase-wide")
    }
    assert digests == {
        "fixed": "631f87c47f183b8c",
        "paraphrase": "26cfb6e257eeb077",
        "paraphrase-wide": "9a2d2343680d4309",
    }
    passage = "The passage on {title} says {answer}."
    assert passage not in tokenizer_phrases("fixed")
    assert passage in tokenizer_phrases("fixed", reading=True)
    assert " The passage on {title} says" in tokenizer_phrases("paraphrase", reading=True)
    assert " The passage on {title} says" not in tokenizer_phrases("paraphrase")
