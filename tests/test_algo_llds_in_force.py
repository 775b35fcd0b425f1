"""`LLDSInForce`: what LLDS applies at one step, decided once from the settings in force and
the batch's searches, and read by the objective and the probe (the trainer's reads are checked
by the behaviour digests and the trainer's tests)."""

from __future__ import annotations

import dataclasses

import torch

from llds.algo import (
    AlgoConfig,
    LLDSConfig,
    TermInputs,
    aggregate,
    grpo_objective,
    register_loss_term,
    registered_loss_terms,
)
from llds.algo.llds_in_force import LLDSInForce, llds_in_force
from llds.probe.one_step import probe_group
from test_probe_one_step import _mixed_group


def test_the_rules_by_hand() -> None:
    off = LLDSInForce(LLDSConfig(enabled=False, coef=0.5, mask_answer=True, scope="batch"))
    assert off.coef == 0.0 and not off.on
    assert not off.acts(False) and not off.masks_answer and not off.reaches_rest_of_batch
    zero = LLDSInForce(LLDSConfig(coef=0.2))
    assert zero.coef == 0.2 and zero.acts(False) and not zero.acts(True)
    assert not zero.acts_on_first_update and not zero.masks_answer
    computed = LLDSInForce(LLDSConfig(coef=0.2, first_update="computed", scope="batch"))
    assert computed.acts(True) and computed.acts_on_first_update and computed.reaches_rest_of_batch
    assert not LLDSInForce(LLDSConfig(coef=0.0)).on  # enabled at 0 adds nothing


def test_answer_weight_from_the_batchs_searches_only_when_needed() -> None:
    asked: list[int] = []

    def searches() -> float:
        asked.append(1)
        return 1.5

    ma = LLDSConfig(mask_answer=True)  # the paper's schedule: min(V / 2, 1)
    assert llds_in_force(ma, searches).answer_weight == 0.75 and asked == [1]
    fixed = LLDSConfig(mask_answer=True, answer_weight=0.3)
    assert llds_in_force(fixed, searches).answer_weight == 0.3
    assert llds_in_force(LLDSConfig(mask_answer=True, answer_weight=0.3)).answer_weight == 0.3
    assert llds_in_force(LLDSConfig(), searches).answer_weight == 1.0  # no LLDS-MA
    off = LLDSConfig(enabled=False, mask_answer=True)
    assert llds_in_force(off, searches).answer_weight == 1.0
    assert asked == [1]  # a fixed weight, no LLDS-MA or LLDS off: the searches are not counted
    assert llds_in_force(ma).answer_weight == 1.0  # searches unknown: unweighted


def _case():
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 5, generator=g)
    logp = (old - 0.3 * torch.rand(4, 5, generator=g)).requires_grad_()
    adv = torch.tensor([1.0, 0.5, -0.5, 0.0])
    mask = torch.ones(4, 5, dtype=torch.bool)
    answer = torch.zeros(4, 5, dtype=torch.bool)
    answer[:, -2:] = True
    return logp, old, adv, mask, answer


def test_the_objective_reads_the_llds_in_force_over_the_configs() -> None:
    logp, old, adv, mask, answer = _case()
    config = AlgoConfig(llds=LLDSConfig(enabled=False))  # the config's: LLDS off
    plain, _ = grpo_objective(TermInputs(logp, old, adv, mask), config)
    on = LLDSInForce(LLDSConfig(coef=2.0, gate="token", aggregation="token-mean"))
    got, stats = grpo_objective(TermInputs(logp, old, adv, mask, llds=on), config)
    # by hand: coef * token-mean over all tokens of relu(old - logp) on rows with advantage >= 0
    d = (old - logp.detach()).clamp(min=0) * (adv >= 0).unsqueeze(-1)
    assert torch.allclose(got - plain, 2.0 * d.sum() / mask.sum())
    assert float(stats["llds/loss"]) > 0
    # the first update under `first_update: zero`: statistics only
    quiet, _ = grpo_objective(TermInputs(logp, old, adv, mask, llds=on, first_update=True), config)
    assert float(quiet.detach()) == float(plain.detach())
    # LLDS-MA: the answer span weighted by the in-force beta
    ma = LLDSInForce(dataclasses.replace(on.settings, mask_answer=True), answer_weight=0.5)
    x = TermInputs(logp, old, adv, mask, answer_mask=answer, llds=ma)
    weighted, _ = grpo_objective(x, config)
    w = torch.where(answer, 0.5, 1.0)
    assert torch.allclose(weighted - plain, 2.0 * (d * w).sum() / mask.sum())


TERM = "llds_in_force_push_up"
CALLS: list[float] = []


def push_up(x: TermInputs, algo: AlgoConfig):
    """A registered term that raises every response's likelihood: -coef * token-mean log pi."""
    CALLS.append(algo.extra_terms[TERM])
    value = aggregate(x.log_probs, x.loss_mask, "token-mean")
    return -algo.extra_terms[TERM] * value, {}


if TERM not in registered_loss_terms():
    register_loss_term(TERM)(push_up)


def test_the_probe_runs_the_runs_extra_terms_and_its_llds_in_force(
    small_world, world_tokenizer, world_retriever
) -> None:
    model, batch, _, _ = _mixed_group(small_world, world_tokenizer, world_retriever)
    lr = 0.05
    CALLS.clear()
    plain = probe_group(model, batch, lr=lr, objective=AlgoConfig(llds=LLDSConfig(enabled=False)))
    assert CALLS == []
    objective = AlgoConfig(llds=LLDSConfig(enabled=False), extra_terms={TERM: 3.0})
    pushed = probe_group(model, batch, lr=lr, objective=objective)
    assert CALLS and set(CALLS) == {3.0}
    mask = batch.loss_mask
    # the term pushes every response up: the probe's update moved them more than GRPO alone
    assert ((pushed.new - pushed.old)[mask].sum()) > ((plain.new - plain.old)[mask].sum())
    # the LLDS settings in force replace the objective's (a rollback turns LLDS on): from the
    # second of three updates on, LLDS changes where the weights go
    three = probe_group(model, batch, lr=0.4, updates=3, objective=objective)
    on = LLDSConfig(coef=50.0, gate="token")
    three_llds = probe_group(model, batch, lr=0.4, updates=3, objective=objective, llds=on)
    assert not torch.equal(three.new, three_llds.new)
