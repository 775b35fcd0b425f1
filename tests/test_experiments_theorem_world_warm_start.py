"""The warm-start measurement: each number checked against a direct computation from the same
sampled groups (full-vocabulary forward, the episodes' own token lists)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from conftest import make_tiny_model, tag_happy
from llds.probe.one_step import first_order_displacement, probe_objective
from llds.rollout import RolloutConfig
from theorem_world.warm_start_report import (
    MIN_ACCURACY,
    MIN_ENTROPY,
    WarmStartReport,
    markdown_table,
    measure_batches,
    sample_groups,
)

TEMPLATE = "Question: {question}\n"
T = 0.8
CFG = RolloutConfig(
    group_size=6,
    max_turns=1,
    max_turn_tokens=16,
    max_obs_tokens=32,
    max_total_tokens=200,
    topk=2,
    temperature=T,
)


def _declare_gold(batch) -> None:
    """Make each group's first answered row right, and every row giving that answer: sampled
    groups from a random model then mix right and wrong responses."""
    gold: dict[str, str] = {}
    for ep in batch.episodes:
        if ep.answer and ep.answer.strip():
            gold.setdefault(ep.group_id, ep.answer)
    batch.rewards = torch.tensor(
        [float(gold.get(ep.group_id) == ep.answer) for ep in batch.episodes]
    )


@pytest.fixture(scope="module")
def sampled(small_world, world_tokenizer, world_retriever):
    model = tag_happy(make_tiny_model(world_tokenizer, seed=7), world_tokenizer, bias=5.0)
    batches = list(
        sample_groups(
            model,
            world_tokenizer,
            world_retriever,
            small_world.train[:6],
            CFG,
            seed=1,
            template=TEMPLATE,
            questions_per_chunk=3,
        )
    )
    for b in batches:
        _declare_gold(b)
    return model, batches


def _first_action(ep) -> tuple[int, ...]:
    """The leading run of model-written tokens of an episode."""
    out = []
    for tok, written in zip(ep.response_ids, ep.action_mask, strict=False):
        if not written:
            break
        out.append(tok)
    return tuple(out)


def _direct(model, batches):
    """Entropy, log-likelihoods and counts from a plain full-vocabulary forward."""
    ent_sum = tokens = 0.0
    lp = {True: 0.0, False: 0.0}
    counts = {True: [], False: []}
    with torch.no_grad():
        for b in batches:
            mask = b.attention_mask
            logits = model(
                input_ids=b.input_ids,
                attention_mask=mask,
                position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            ).logits[:, b.prompt_len - 1 : -1]
            logp = torch.log_softmax(logits.float() / T, -1)
            ent = -(logp.exp() * logp).sum(-1)
            tok_lp = logp.gather(-1, b.response_ids.unsqueeze(-1)).squeeze(-1)
            written = b.loss_mask.bool()
            ent_sum += float(ent[written].sum())
            tokens += int(written.sum())
            for i in range(len(b)):
                ok = bool(b.rewards[i] > 0)
                lp[ok] += float(tok_lp[i][written[i]].sum())
                counts[ok].append(int(written[i].sum()))
    return ent_sum / tokens, lp, counts


def test_measurements_match_a_direct_computation(sampled):
    model, batches = sampled
    report = measure_batches(model, batches, T)
    rows = [(b, i) for b in batches for i in range(len(b))]
    right = [bool(b.rewards[i] > 0) for b, i in rows]
    assert 0 < sum(right) < len(rows)  # the test needs both kinds
    assert report.responses == len(rows) == 6 * CFG.group_size
    assert report.questions == 6 and report.group_size == CFG.group_size
    assert report.accuracy == pytest.approx(sum(right) / len(rows))

    entropy, lp, counts = _direct(model, batches)
    assert report.entropy_per_token == pytest.approx(entropy, rel=1e-4)
    assert report.tokens_right == counts[True] and report.tokens_wrong == counts[False]
    assert report.loglik_per_token_right == pytest.approx(lp[True] / sum(counts[True]), rel=1e-4)
    assert report.loglik_per_token_wrong == pytest.approx(lp[False] / sum(counts[False]), rel=1e-4)

    wrong = shared = mixed = 0
    for b in batches:
        groups: dict[str, list] = {}
        for ep, r in zip(b.episodes, b.rewards.tolist(), strict=True):
            groups.setdefault(ep.group_id, []).append((_first_action(ep), r > 0))
        for members in groups.values():
            good = {a for a, ok in members if ok}
            if not good or all(ok for _, ok in members):
                continue
            mixed += 1
            bad = [a for a, ok in members if not ok]
            wrong += len(bad)
            shared += sum(a in good for a in bad)
    assert report.mixed_groups == mixed > 0
    assert report.wrong_in_mixed_groups == wrong
    assert report.first_action_shared == pytest.approx(shared / wrong)
    assert -1.0 <= report.hidden_cosine <= 1.0


def test_first_action_share_counts_copies_of_right_responses(sampled):
    model, batches = sampled
    b = batches[0]
    firsts = [_first_action(ep) for ep in b.episodes]
    other = next(j for j in range(1, len(b)) if firsts[j] != firsts[0])
    # one group: a right row, a wrong exact copy of it, and a wrong row that starts differently
    trio = b.select([0, 0, other])
    trio.group_ids = ["g"] * 3
    trio.rewards = torch.tensor([1.0, 0.0, 0.0])
    report = measure_batches(model, [trio], T, probe_groups=0)
    assert report.mixed_groups == 1 and report.wrong_in_mixed_groups == 2
    assert report.first_action_shared == pytest.approx(0.5)
    assert report.probe_low.groups == report.probe_high.groups == 0


def test_first_search_share_compares_the_first_query_alone(sampled):
    model, batches = sampled
    quad = batches[0].select([0, 1, 2, 3])
    quad.group_ids = ["g"] * 4
    quad.rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    # right asks "capital of Xo"; wrong: the same query (spaced), another query, no search
    queries = [["capital of Xo", "x"], [" capital of Xo ", "y"], ["river of Xo"], []]
    quad.episodes = [
        dataclasses.replace(ep, queries=q) for ep, q in zip(quad.episodes, queries, strict=True)
    ]
    report = measure_batches(model, [quad], T, probe_groups=0)
    assert report.wrong_in_mixed_groups == 3
    assert report.first_search_shared == pytest.approx(1 / 3)


def test_probe_bands_match_first_order_signs(sampled):
    model, batches = sampled
    report = measure_batches(model, batches, T)
    objective = probe_objective(0.2, "token-mean", 0.0)
    fell = {"low": [], "high": []}
    by_correct: dict[int, list[bool]] = {}
    for b in batches:
        for g in dict.fromkeys(b.group_ids):
            rows = [i for i, x in enumerate(b.group_ids) if x == g]
            ok = (b.rewards[rows] > 0).tolist()
            if all(ok) or not any(ok):
                continue
            total = first_order_displacement(model, b.select(rows), objective, temperature=T).total
            band = "low" if sum(ok) / len(ok) <= 0.5 else "high"
            fell[band] += [float(total[j]) < 0 for j, o in enumerate(ok) if o]
            by_correct.setdefault(sum(ok), []).extend(
                float(total[j]) < 0 for j, o in enumerate(ok) if o
            )
    assert sorted(report.probe_by_correct) == sorted(by_correct)
    for k, signs in by_correct.items():
        got = report.probe_by_correct[k]
        assert got.correct_responses == len(signs)
        assert got.groups * k == len(signs)  # k correct responses in each such group
        assert got.share_drag_over_pull == pytest.approx(sum(signs) / len(signs))
    for band, got in (("low", report.probe_low), ("high", report.probe_high)):
        assert got.correct_responses == len(fell[band])
        if fell[band]:  # drag over pull <=> the first-order change is negative
            assert got.share_drag_over_pull == pytest.approx(sum(fell[band]) / len(fell[band]))
        else:
            assert math.isnan(got.share_drag_over_pull)
    assert report.probe_low.groups + report.probe_high.groups == report.mixed_groups


def test_conditions_thresholds_and_table():
    base = WarmStartReport(
        questions=1, group_size=2, temperature=1.0, responses=2, accuracy=MIN_ACCURACY,
        entropy_per_token=MIN_ENTROPY, tokens_right=[3], tokens_wrong=[5],
    )  # fmt: skip
    assert base.meets_conditions
    low_entropy = WarmStartReport(**{**base.__dict__, "entropy_per_token": MIN_ENTROPY - 0.01})
    low_accuracy = WarmStartReport(**{**base.__dict__, "accuracy": MIN_ACCURACY - 0.01})
    assert not low_entropy.meets_conditions and not low_accuracy.meets_conditions
    d = base.to_dict()
    assert d["tokens_wrong_mean"] == 5 and d["tokens_right_n"] == 1 and d["meets_conditions"]
    table = markdown_table(base)
    assert "| entropy_per_token | 0.300 |" in table and "probe_high.groups" in table


def test_greedy_sampling_is_refused(small_world, world_tokenizer, world_retriever):
    model = make_tiny_model(world_tokenizer)
    greedy = RolloutConfig(group_size=2, max_turns=1, temperature=0.0)
    with pytest.raises(ValueError, match="temperature"):
        list(sample_groups(model, world_tokenizer, world_retriever, small_world.train[:1], greedy))
