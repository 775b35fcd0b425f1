"""Expert trajectories: token layout identical to the rollout engine's, masks, protocol, filters."""

from __future__ import annotations

import pytest
import torch

from llds.algo import action_segments
from llds.data.example import QAExample
from llds.data.world import WorldConfig, generate_world
from llds.env import (
    compute_reward,
    extract_answer,
    information_block,
    is_valid_sequence,
    parse_action,
)
from llds.env.prompts import build_prompt_ids
from llds.models import train_bpe_tokenizer
from llds.retrieval.base import Hit
from llds.retrieval.bm25 import BM25Retriever
from llds.rollout import RolloutConfig, RolloutEngine, RolloutRequest
from llds.sft.data import (
    EXPERT_PHRASES,
    build_expert_episodes,
    early_answer_variant,
    expert_actions,
)


@pytest.fixture(scope="module")
def world():
    return generate_world(
        WorldConfig.preset(
            "organism", num_entities=60, num_train=24, num_test=6, hop_mix={1: 0.4, 2: 0.4, 3: 0.2}
        )
    )


@pytest.fixture(scope="module")
def tokenizer(world):
    texts = [d["contents"] for d in world.corpus] + [ex.question for ex in world.train]
    return train_bpe_tokenizer([*texts, *EXPERT_PHRASES], vocab_size=700)


@pytest.fixture(scope="module")
def retriever(world):
    return BM25Retriever.build(world.corpus, show_progress=False)


@pytest.fixture(scope="module")
def episodes(world, tokenizer, retriever):
    eps, stats = build_expert_episodes(world.train, retriever, tokenizer)
    assert stats.kept == len(world.train) == len(eps)
    return eps


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_layout_piece_by_piece(world, tokenizer, retriever, episodes) -> None:
    for ex, ep in zip(world.train, episodes, strict=True):
        chain = ex.metadata["chain"]
        expected = list(build_prompt_ids(tokenizer, ex.question))
        mask = [0] * len(expected)
        for action, hop in zip(ep.action_texts[:-1], chain, strict=True):
            hits = retriever.search([hop["query"]], 3)[0]
            obs = information_block(hits, tokenizer=tokenizer, max_tokens=500)
            expected += _ids(tokenizer, action) + _ids(tokenizer, obs)
            mask += [1] * len(_ids(tokenizer, action)) + [0] * len(_ids(tokenizer, obs))
            # the gold passage of the hop is in what the model is shown
            gold = next(d["contents"] for d in world.corpus if d["id"] == hop["doc_id"])
            assert gold.split("\n", 1)[1] in obs
        expected += _ids(tokenizer, ep.action_texts[-1])
        mask += [1] * len(_ids(tokenizer, ep.action_texts[-1]))
        assert ep.input_ids == expected
        assert ep.loss_mask == mask
        assert ep.prompt_len == len(build_prompt_ids(tokenizer, ex.question))
        assert sum(ep.loss_mask[: ep.prompt_len]) == 0


def test_segments_and_protocol(world, tokenizer, episodes) -> None:
    for ex, ep in zip(world.train, episodes, strict=True):
        hops = ex.metadata["hops"]
        _, n_actions = action_segments(torch.tensor([ep.response_mask]))
        assert int(n_actions[0]) == hops + 1 == len(ep.action_texts)
        response = tokenizer.decode(ep.response_ids, skip_special_tokens=False)
        assert is_valid_sequence(response)
        assert extract_answer(response) == ex.answers[0]
        assert compute_reward(response, ex.answers).em == 1.0
        actions = [parse_action(t) for t in ep.action_texts]
        assert [a.kind for a in actions] == ["search"] * hops + ["answer"]
        assert [a.content for a in actions[:-1]] == [h["query"] for h in ex.metadata["chain"]]
        # only action tokens are trained: decoding them gives exactly the action texts
        trained = [t for t, m in zip(ep.input_ids, ep.loss_mask, strict=True) if m]
        assert tokenizer.decode(trained) == "".join(ep.action_texts)


class _ScriptedLM(torch.nn.Module):
    """A stand-in policy that always puts its argmax on the next token of a fixed sequence.

    It reads the position of the next token from the attention mask (cache + new tokens), so the
    rollout engine can drive it turn by turn like a real model.
    """

    def __init__(self, script: list[int], vocab: int) -> None:
        super().__init__()
        self.script = script
        self.vocab = vocab
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.generation_config = None

    def forward(self, input_ids, attention_mask, **_):
        pos = int(attention_mask[0].sum())
        logits = torch.zeros(1, 1, self.vocab)
        logits[0, 0, self.script[pos] if pos < len(self.script) else 0] = 1.0

        class _Cache:
            def batch_select_indices(self, _idx):
                pass

        return type("Out", (), {"logits": logits, "past_key_values": _Cache()})()


def test_engine_replay_gives_identical_tokens(world, tokenizer, retriever, episodes) -> None:
    """The rollout engine, fed the expert's actions, produces the same ids and action mask."""
    cfg = RolloutConfig(max_turns=4, temperature=0.0, group_size=1)
    for ex, ep in list(zip(world.train, episodes, strict=True))[:6]:
        model = _ScriptedLM(ep.input_ids, len(tokenizer))
        engine = RolloutEngine(model, tokenizer, retriever, cfg)
        batch = engine.generate([RolloutRequest(ep.prompt_ids, ex.id, ex.id, ex.answers)])
        got = batch.episodes[0]
        assert got.response_ids == ep.response_ids
        assert got.action_mask == ep.response_mask
        assert got.em == 1.0 and got.num_valid_searches == ex.metadata["hops"]


def test_max_hops_and_num_examples(world, tokenizer, retriever) -> None:
    eps, stats = build_expert_episodes(world.train, retriever, tokenizer, max_hops=1)
    n_single = sum(ex.metadata["hops"] == 1 for ex in world.train)
    assert len(eps) == n_single and all(e.hops == 1 for e in eps)
    assert stats.skipped_hops == len(world.train) - n_single
    few, _ = build_expert_episodes(world.train, retriever, tokenizer, num_examples=3)
    assert [e.example_id for e in few] == [ex.id for ex in world.train[:3]]


def test_early_answers_stop_short_and_answer_the_last_name_read(
    world, tokenizer, retriever
) -> None:
    eps, stats = build_expert_episodes(
        world.train, retriever, tokenizer, early_answer=0.5, think=False
    )
    by_id = {ex.id: ex for ex in world.train}
    early = [e for e in eps if e.hops < by_id[e.example_id].metadata["hops"]]
    assert stats.early_answers == len(early) and 0 < len(early) < len(eps)
    for e in early:
        ex = by_id[e.example_id]
        chain = ex.metadata["chain"]
        # the searches are the chain's first hops, and the answer is the last name the
        # demonstrator had: the question's start entity, or the answer of its last search
        assert list(e.queries) == [h["query"] for h in chain[: e.hops]]
        expected = chain[e.hops - 1]["answer"] if e.hops else ex.metadata["start"]
        assert e.answer == expected and e.answer not in ex.answers
        assert e.action_texts[-1] == f"<answer> {expected} </answer>"
        assert len(e.observations) == e.hops
    assert any(e.hops == 0 for e in early)  # answering without any search happens too
    # the rest are the full expert, unchanged; the choice is seeded per example
    full, _ = build_expert_episodes(world.train, retriever, tokenizer, think=False)
    untouched = [e for e in eps if e not in early]
    assert untouched == [f for f in full if f.example_id in {e.example_id for e in untouched}]
    again, _ = build_expert_episodes(
        world.train, retriever, tokenizer, early_answer=0.5, think=False
    )
    assert again == eps
    none, none_stats = build_expert_episodes(
        world.train, retriever, tokenizer, early_answer=0.0, think=False
    )
    assert none == full and none_stats.early_answers == 0
    with pytest.raises(ValueError, match="early_answer"):
        build_expert_episodes(world.train, retriever, tokenizer, early_answer=1.5)


def test_early_answer_hop_count_is_uniform_below_the_chain(world) -> None:
    import random

    ex = next(e for e in world.train if e.metadata["hops"] == 3)
    rng = random.Random(0)
    kept = [len(early_answer_variant(ex, rng).metadata["chain"]) for _ in range(3000)]
    # j uniform in 0..h-1: each of 0, 1, 2 about a third of the time, never 3
    assert set(kept) == {0, 1, 2}
    for j in range(3):
        assert abs(kept.count(j) / len(kept) - 1 / 3) < 0.04


def test_think_wording_is_seeded_and_optional(world) -> None:
    ex = next(e for e in world.train if e.metadata["hops"] >= 2)
    assert expert_actions(ex, seed=1) == expert_actions(ex, seed=1)
    variants = {
        tuple(expert_actions(e, seed=s)[0].split("</think>")[0] for e in world.train[:8])
        for s in range(4)
    }
    assert len(variants) > 1
    bare = expert_actions(ex, think=False)
    assert bare[0] == f"<search> {ex.metadata['chain'][0]['query']} </search>"
    assert bare[-1] == f"<answer> {ex.answers[0]} </answer>"


class _FixedRetriever:
    def __init__(self, by_query: dict[str, list[Hit]]) -> None:
        self.by_query = by_query
        self.calls: list[list[str]] = []

    def search(self, queries, k):
        self.calls.append(list(queries))
        return [self.by_query.get(q, [])[:k] for q in queries]


def test_real_qa_one_hop_kept_only_when_retrieval_has_gold(tokenizer) -> None:
    hit = Hit("d1", '"Paris"\nParis is the capital of France.', 1.0)
    retriever = _FixedRetriever(
        {
            "What is the capital of France?": [hit],
            "Who wrote Hamlet?": [hit],
        }
    )
    yes = QAExample("q:1", "What is the capital of France?", ("Paris", "Paris, France"))
    no = QAExample("q:2", "Who wrote Hamlet?", ("Shakespeare",))
    eps, stats = build_expert_episodes([yes, no], retriever, tokenizer)
    assert [e.example_id for e in eps] == ["q:1"]
    assert stats.skipped_no_gold_in_retrieval == 1
    assert retriever.calls == [[yes.question, no.question]]  # one batched retriever call
    ep = eps[0]
    assert ep.queries == (yes.question,) and ep.answer == "Paris"
