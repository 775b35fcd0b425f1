"""Warm-start readiness: each figure against a plain recomputation from the same rollouts."""

from __future__ import annotations

import dataclasses
import re

import pytest

from conftest import make_tiny_model, tag_happy
from llds.env.prompts import build_prompt_ids
from llds.evaluation.readiness import copies_question, readiness
from llds.rollout import RolloutConfig, RolloutEngine, RolloutRequest


def test_copies_question_by_hand():
    assert copies_question("Paris", "Is Paris the capital of France?")
    assert copies_question("the Paris", "Is paris the capital?")  # articles and case dropped
    assert not copies_question("Par", "Is Paris the capital?")  # whole words only
    assert not copies_question(None, "Is Paris the capital?")
    assert not copies_question("Lyon", "Is Paris the capital?")


def _words(text: str) -> list[str]:
    return [w for w in re.sub(r"[^\w\s]", "", text.lower()).split() if w not in ("a", "an", "the")]


def _sampled(model, tok, retriever, cfg, prompts, examples, samples, seed):
    """The sampled rollouts readiness makes: the same seeds, so the same rollouts."""
    sample_cfg = dataclasses.replace(cfg, group_size=samples)
    return (
        RolloutEngine(model, tok, retriever, sample_cfg)
        .generate(
            [
                RolloutRequest(
                    p, e.id, f"{e.id}@{j}", e.answers, seed=seed * 1_000_003 + i * samples + j
                )
                for i, (p, e) in enumerate(zip(prompts, examples, strict=True))
                for j in range(samples)
            ]
        )
        .episodes
    )


def test_readiness_equals_a_plain_recomputation(small_world, world_tokenizer, world_retriever):
    tok = world_tokenizer
    model = tag_happy(make_tiny_model(tok, seed=5), tok)
    cfg = RolloutConfig(max_turns=1, max_turn_tokens=16, max_total_tokens=400, topk=2)
    base = list(small_world.train[:8])
    prompts = [build_prompt_ids(tok, ex.question) for ex in base]
    # the gold answer of every other question set to what its first sample answers: that
    # sample is right by construction (a rollout depends on its prompt and seed, not on the
    # answers), so sampled EM and mixed groups are not all zero
    first = _sampled(model, tok, world_retriever, cfg, prompts, base, 3, 7)
    examples, made_right = [], 0
    for i, ex in enumerate(base):
        ep = first[i * 3]
        if i % 2 == 0 and ep.stop_reason == "answer" and ep.answer and ep.answer.strip():
            examples.append(dataclasses.replace(ex, answers=(ep.answer,)))
            made_right += 1
        else:
            examples.append(ex)
    assert made_right >= 1, "the tag-biased tiny model should answer some sampled rollouts"

    got = readiness(model, tok, world_retriever, examples, cfg, samples=3, seed=7)

    greedy_cfg = dataclasses.replace(cfg, temperature=0.0, group_size=1)
    greedy = (
        RolloutEngine(model, tok, world_retriever, greedy_cfg)
        .generate(
            [
                RolloutRequest(p, e.id, e.id, e.answers)
                for p, e in zip(prompts, examples, strict=True)
            ]
        )
        .episodes
    )
    n = len(examples)
    assert got.questions == n
    assert got.em == pytest.approx(sum(ep.em for ep in greedy) / n)
    answered = [
        (ep, e)
        for ep, e in zip(greedy, examples, strict=True)
        if ep.stop_reason == "answer" and ep.answer
    ]
    assert got.answered == pytest.approx(len(answered) / n)
    if answered:
        copies = [
            bool(_words(ep.answer)) and " ".join(_words(ep.answer)) in " ".join(_words(e.question))
            for ep, e in answered
        ]
        assert got.copy_share == pytest.approx(sum(copies) / len(answered))
    else:  # nothing answered greedily: no share to give
        assert got.copy_share != got.copy_share
    assert got.searches == pytest.approx(sum(ep.num_valid_searches for ep in greedy) / n)
    sampled = _sampled(model, tok, world_retriever, cfg, prompts, examples, 3, 7)
    assert got.sampled_em == pytest.approx(sum(ep.em for ep in sampled) / (3 * n))
    assert got.sampled_em >= made_right / (3 * n) > 0
    groups = [[sampled[i * 3 + j].em for j in range(3)] for i in range(n)]
    assert got.mixed_share == pytest.approx(sum(0 < sum(g) < 3 for g in groups) / n)
    tokens = [(h, m) for ep in sampled for h, m in zip(ep.entropies, ep.action_mask, strict=True)]
    assert got.entropy == pytest.approx(sum(h for h, m in tokens if m) / sum(m for _, m in tokens))
    assert got.entropy > 0
    with pytest.raises(ValueError, match="2 samples"):
        readiness(model, tok, world_retriever, examples, cfg, samples=1)
