"""The one-step probe: weights come back untouched, and with SGD the measured displacement of
each response matches the first-order prediction -lr * grad(L) . grad(log p_i)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from conftest import make_tiny_model, tag_happy
from llds.algo import group_advantages, policy_loss
from llds.data.example import QAExample
from llds.env.prompts import build_prompt_ids
from llds.policy.forward import response_log_probs
from llds.probe.one_step import (
    ProbeResult,
    drag_to_pull,
    probe_group,
    probe_metrics,
    run_probe,
    summarize,
)
from llds.rollout import RolloutConfig, RolloutEngine, RolloutRequest

TEMPLATE = "Question: {question}\n"
CFG = RolloutConfig(
    max_turns=1, max_turn_tokens=16, max_obs_tokens=32, max_total_tokens=200, topk=2
)


def _mixed_group(world, tok, retriever, cfg: RolloutConfig = CFG):
    """Sample a group, then declare one sampled answer gold: the same seed reproduces the
    group, which now has both correct and incorrect responses."""
    model = tag_happy(make_tiny_model(tok, seed=7), tok, bias=5.0)
    q = world.train[0]
    ids = build_prompt_ids(tok, q.question, TEMPLATE)
    engine = RolloutEngine(model, tok, retriever, cfg)
    for seed in range(20):
        reqs = [RolloutRequest(ids, q.id, q.id, ("zzz-none",)) for _ in range(6)]
        batch = engine.generate(reqs, generator=torch.Generator().manual_seed(seed * 1_000_003))
        answers = [e.answer for e in batch.episodes if e.answer and e.answer.strip()]
        if answers and len(answers) < 6:
            gold = answers[0]
            reqs = [RolloutRequest(ids, q.id, q.id, (gold,)) for _ in range(6)]
            batch = engine.generate(reqs, generator=torch.Generator().manual_seed(seed * 1_000_003))
            ex = dataclasses.replace(q, answers=(gold,))
            return model, batch, ex, seed
    raise AssertionError("could not sample a mixed group")


def test_probe_matches_first_order_prediction_and_restores_weights(
    small_world, world_tokenizer, world_retriever
):
    model, batch, _, _ = _mixed_group(small_world, world_tokenizer, world_retriever)
    assert 0 < int((batch.rewards > 0).sum()) < len(batch)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lr = 1e-3
    old, new, first_order, drag = probe_group(model, batch, lr=lr, optimizer="sgd")
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k

    # independent first-order prediction
    params = [p for p in model.parameters() if p.requires_grad]
    model.eval()
    lp, _ = response_log_probs(model, batch)
    adv = group_advantages(batch.rewards, batch.group_ids)
    loss, _ = policy_loss(lp, lp.detach(), adv, batch.loss_mask)
    g_loss = torch.autograd.grad(loss, params, retain_graph=True)
    mask = batch.loss_mask
    for i in range(len(batch)):
        if not mask[i].any():
            continue
        g_i = torch.autograd.grad(lp[i][mask[i]].sum(), params, retain_graph=True)
        predicted = -lr * sum((a * b).sum() for a, b in zip(g_loss, g_i, strict=True)).item()
        measured = (new[i] - old[i])[mask[i]].sum().item()
        assert abs(measured - predicted) <= 0.15 * abs(predicted) + 1e-5, (i, measured, predicted)
        # the probe's own first-order quantity is the same inner product, per unit step
        assert lr * float(first_order[i]) == pytest.approx(predicted, rel=1e-4, abs=1e-9), i
        # Eq. 3's two sums: the drag of the A < 0 responses and the pull of the A > 0 ones,
        # each from its own loss; they add up to the whole (the loss is linear in A at ratio 1)
        drag_i = _inner(g_i, _loss_grad(model, batch, params, adv.clamp(max=0)))
        pull_i = _inner(g_i, _loss_grad(model, batch, params, adv.clamp(min=0)))
        assert float(drag[i]) == pytest.approx(drag_i, rel=1e-4, abs=1e-7), i
        assert float(first_order[i]) == pytest.approx(pull_i + drag_i, rel=1e-4, abs=1e-7), i


def _loss_grad(model, batch, params, adv):
    """-grad of the plain GRPO loss with the given advantages (pi_old = pi)."""
    lp, _ = response_log_probs(model, batch)
    loss, _ = policy_loss(lp, lp.detach(), adv, batch.loss_mask)
    return [-g for g in torch.autograd.grad(loss, params)]


def _inner(a, b) -> float:
    return sum(float((x * y).sum()) for x, y in zip(a, b, strict=True))


def _sampled_log_probs(model, batch, temperature: float) -> torch.Tensor:
    """`log softmax(logits / T)` of each written response token, `[B, R]` (0 elsewhere): one
    plain forward per row over its unpadded tokens, independent of the probe's batched path."""
    out = torch.zeros(batch.loss_mask.shape)
    p = batch.prompt_len
    with torch.no_grad():
        for i in range(len(batch)):
            valid = batch.attention_mask[i].bool()
            logits = model(input_ids=batch.input_ids[i][valid][None]).logits[0].float()
            logp = torch.log_softmax(logits / temperature, dim=-1)
            for j in torch.nonzero(batch.loss_mask[i]).flatten().tolist():
                k = int(valid[: p + j].sum())  # the token's index among the row's real tokens
                out[i, j] = logp[k - 1, batch.input_ids[i, p + j]]
    return out


def test_the_probe_scores_and_updates_at_the_sampling_temperature(
    small_world, world_tokenizer, world_retriever
):
    t = 0.5
    cfg = dataclasses.replace(CFG, temperature=t)
    model, batch, ex, seed = _mixed_group(small_world, world_tokenizer, world_retriever, cfg)
    model.eval()
    mask = batch.loss_mask
    lr = 0.05
    probe = probe_group(model, batch, lr=lr, temperature=t)
    expected = _sampled_log_probs(model, batch, t)
    assert torch.allclose(probe.old[mask], expected[mask], atol=1e-5)
    at_one = _sampled_log_probs(model, batch, 1.0)
    assert (at_one[mask] - expected[mask]).abs().max() > 0.1  # T = 1 would be told apart
    # the update is an SGD step on the loss of the tempered log-probs, and the first-order
    # terms are the inner products of their gradients
    ref_old, ref_new = _sgd_updates(model, batch, lr, 1, 0.0, temperature=t)
    assert torch.allclose(probe.old[mask], ref_old[mask], atol=1e-5)
    assert torch.allclose(probe.new[mask], ref_new[mask], atol=1e-4)
    assert (probe.new - probe.old)[mask].abs().max() > 1e-2
    params = [p for p in model.parameters() if p.requires_grad]
    lp, _ = response_log_probs(model, batch, temperature=t)
    adv = group_advantages(batch.rewards, batch.group_ids)
    loss, _ = policy_loss(lp, lp.detach(), adv, mask)
    g_loss = torch.autograd.grad(loss, params, retain_graph=True)
    for i in range(len(batch)):
        if not mask[i].any():
            continue
        g_i = torch.autograd.grad(lp[i][mask[i]].sum(), params, retain_graph=True)
        predicted = -_inner(g_loss, g_i)
        assert float(probe.first_order[i]) == pytest.approx(predicted, rel=1e-4, abs=1e-7), i
    # run_probe scores each group at the temperature its rollouts were sampled at
    [r] = run_probe(
        model, world_tokenizer, world_retriever, [ex], group_size=6, rollout=cfg, lr=lr,
        seed=seed, template=TEMPLATE, progress=False,
    )  # fmt: skip
    correct = batch.rewards > 0
    assert r.first_order_correct == pytest.approx(float(probe.first_order[correct].mean()))
    untempered = probe_group(model, batch, lr=lr)
    assert r.first_order_correct != pytest.approx(float(untempered.first_order[correct].mean()))


def test_drag_to_pull_by_hand() -> None:
    def r(total: float, drag: float) -> ProbeResult:
        return ProbeResult("q", "q?", 1, 1, 0.0, 0.0, 0.0, 0.0, total, 0.0, drag)

    assert drag_to_pull(r(total=3.0, drag=-1.0)) == pytest.approx(0.25)  # pull 4, drag 1
    assert drag_to_pull(r(total=-1.0, drag=-3.0)) == pytest.approx(1.5)  # pull 2, drag 3: LLD
    assert drag_to_pull(r(total=2.0, drag=0.5)) == pytest.approx(-1 / 3)  # negatives push up
    assert drag_to_pull(r(total=-1.0, drag=-1.0)) == math.inf  # no pull at all
    s = summarize([r(3.0, -1.0), r(-1.0, -3.0), r(2.0, 0.5)])
    assert s["median_drag_to_pull"] == pytest.approx(0.25)
    assert s["mean_first_order_correct_drag"] == pytest.approx((-1.0 - 3.0 + 0.5) / 3)


def test_run_probe_reports_mixed_groups_only(small_world, world_tokenizer, world_retriever):
    model, batch, ex, seed = _mixed_group(small_world, world_tokenizer, world_retriever)
    all_wrong = QAExample("w:never", ex.question, ("no such answer 123",), "w")
    results = run_probe(
        model,
        world_tokenizer,
        world_retriever,
        [ex, all_wrong],
        group_size=6,
        rollout=CFG,
        lr=1e-4,
        seed=seed,
        template=TEMPLATE,
        progress=False,
    )
    assert [r.example_id for r in results] == [ex.id]
    r = results[0]
    assert r.n_correct + r.n_incorrect == 6 and r.n_correct > 0
    s = summarize(results)
    assert s["probed"] == 1 and s["lld_share"] in (0.0, 1.0)
    assert s["first_order_lld_share"] == float(r.first_order_correct < 0)
    m = probe_metrics(results)
    assert m["probe/questions"] == 1.0 and m["probe/first_order_correct"] == r.first_order_correct
    assert m["probe/first_order_drag"] == r.first_order_correct_drag
    assert m["probe/drag_to_pull"] == drag_to_pull(r)
    assert math.isnan(probe_metrics([])["probe/lld_share"])
    # the per-response count agrees with the first-order values of the same group, recomputed
    again = probe_group(model, batch, lr=1e-4)
    assert r.n_correct_first_order_fell == int((again.first_order[batch.rewards > 0] < 0).sum())


def test_probe_metrics_split_by_group_accuracy_by_hand() -> None:
    def r(right: int, wrong: int, total: float, fell: int) -> ProbeResult:
        return ProbeResult("q", "q?", right, wrong, 0.0, 0.0, 0.0, 0.0, total, 0.0, 0.0, fell)

    results = [
        r(6, 2, -0.5, 4),
        r(5, 3, 0.3, 1),
        r(7, 1, 0.2, 0),
        r(2, 6, -0.1, 2),
        r(4, 4, 0.4, 0),
    ]
    m = probe_metrics(results)
    assert m["probe/groups_acc_hi"] == 3 and m["probe/groups_acc_lo"] == 2  # 4 of 8 is not high
    assert m["probe/first_order_lld_share_acc_hi"] == pytest.approx(1 / 3)
    assert m["probe/first_order_lld_share_acc_lo"] == pytest.approx(1 / 2)
    assert m["probe/correct_responses"] == 24
    assert m["probe/correct_first_order_fell_share"] == pytest.approx(7 / 24)
    empty = probe_metrics([r(6, 2, 0.1, 0)])
    assert empty["probe/groups_acc_lo"] == 0 and math.isnan(
        empty["probe/first_order_lld_share_acc_lo"]
    )


def _sgd_updates(model, batch, lr: float, updates: int, llds_coef: float, temperature=1.0):
    """Log-probs after `updates` plain-SGD GRPO steps on `batch`, written out by hand: the clipped
    surrogate against the sampling weights' log-probs, plus lambda * LLDS from the second step;
    every log-prob at `temperature`."""
    import copy

    from llds.algo.llds import llds_loss

    model = copy.deepcopy(model)
    params = [p for p in model.parameters() if p.requires_grad]
    model.eval()
    with torch.no_grad():
        old, _ = response_log_probs(model, batch, temperature=temperature)
    adv = group_advantages(batch.rewards, batch.group_ids)
    for update in range(updates):
        model.zero_grad(set_to_none=True)
        lp, _ = response_log_probs(model, batch, temperature=temperature)
        loss, _ = policy_loss(lp, old, adv, batch.loss_mask, clip_low=0.2)
        if update > 0 and llds_coef > 0:
            loss = loss + llds_loss(lp, old, adv, batch.loss_mask, coef=llds_coef)[0]
        loss.backward()
        with torch.no_grad():
            for p in params:
                p -= lr * p.grad
    with torch.no_grad():
        new, _ = response_log_probs(model, batch, temperature=temperature)
    return old, new


@pytest.mark.parametrize("updates,llds_coef", [(2, 0.0), (3, 1.0)])
def test_probe_with_several_updates_matches_sgd_by_hand(
    small_world, world_tokenizer, world_retriever, updates, llds_coef
):
    model, batch, _, _ = _mixed_group(small_world, world_tokenizer, world_retriever)
    lr = 0.05
    old, new, _, _ = probe_group(model, batch, lr=lr, updates=updates, llds_coef=llds_coef)
    ref_old, ref_new = _sgd_updates(model, batch, lr, updates, llds_coef)
    mask = batch.loss_mask
    assert torch.allclose(old[mask], ref_old[mask], atol=1e-5)
    assert torch.allclose(new[mask], ref_new[mask], atol=1e-4)
    moved = (new - old)[mask].abs().max()
    assert moved > 1e-2  # the updates did something the comparison can see


def test_llds_in_the_probe_is_zero_on_the_first_update_and_acts_after(
    small_world, world_tokenizer, world_retriever
):
    from llds.algo.llds import llds_gate, preserving_mask

    model, batch, _, _ = _mixed_group(small_world, world_tokenizer, world_retriever)
    lr = 0.4  # large enough that two updates lower an action of the correct response
    one = probe_group(model, batch, lr=lr, updates=1, llds_coef=0.0)
    one_llds = probe_group(model, batch, lr=lr, updates=1, llds_coef=1.0)
    assert torch.equal(one.new, one_llds.new)  # pi_theta == pi_old: the penalty is exactly 0
    # here the gate is still shut after one update (LLDS adds nothing to the second) but open
    # on some protected action after two ...
    adv = group_advantages(batch.rewards, batch.group_ids)
    mask = batch.loss_mask
    keep = preserving_mask(adv, mask)
    assert not (llds_gate(one.old - one.new, mask) & keep).any()
    two = probe_group(model, batch, lr=lr, updates=2, llds_coef=0.0)
    two_llds = probe_group(model, batch, lr=lr, updates=2, llds_coef=1.0)
    assert torch.equal(two.new, two_llds.new)
    assert (llds_gate(two.old - two.new, mask) & keep).any()
    # ... so on the third update LLDS changes where the weights go
    three = probe_group(model, batch, lr=lr, updates=3, llds_coef=0.0)
    three_llds = probe_group(model, batch, lr=lr, updates=3, llds_coef=1.0)
    assert not torch.equal(three.new, three_llds.new)
    with pytest.raises(ValueError, match="updates"):
        probe_group(model, batch, lr=lr, updates=0)


def test_a_resumed_probe_gives_what_the_whole_probe_gives(
    small_world, world_tokenizer, world_retriever
):
    model, _, ex, seed = _mixed_group(small_world, world_tokenizer, world_retriever)
    kwargs = dict(group_size=6, rollout=CFG, lr=1e-3, seed=seed, template=TEMPLATE)
    seen: list[tuple[int, ProbeResult | None]] = []
    whole = run_probe(
        model, world_tokenizer, world_retriever, [ex, ex, ex], progress=False,
        on_question=lambda i, r: seen.append((i, r)), **kwargs,
    )  # fmt: skip
    assert [i for i, _ in seen] == [0, 1, 2]
    assert [r for _, r in seen if r is not None] == whole and whole  # question 0 is mixed
    resumed = run_probe(
        model, world_tokenizer, world_retriever, [ex, ex, ex], progress=False, start=1, **kwargs
    )
    assert resumed == [r for i, r in seen if i >= 1 and r is not None]
    seen.clear()
    first = run_probe(
        model, world_tokenizer, world_retriever, [ex, ex, ex], progress=False, max_probed=1,
        on_question=lambda i, r: seen.append((i, r)), **kwargs,
    )  # fmt: skip
    assert first == whole[:1] and [i for i, _ in seen] == [0]  # stops once one was probed


def test_probe_model_resumes_from_its_partial_file_and_names_a_foreign_one(
    tmp_path, small_world, world_tokenizer
):
    import json

    from conftest import write_run_inputs
    from llds.env.protocol import Protocol
    from llds.errors import UserInputError
    from llds.probe.one_step import PARTIAL, ProbeConfig, _settings, probe_model

    write_run_inputs(tmp_path, small_world, world_tokenizer)
    protocol = Protocol(prompt_template=TEMPLATE, topk=2, max_turns=1)
    protocol.write(tmp_path / "model")
    out = tmp_path / "probe"
    cfg = ProbeConfig(
        model=str(tmp_path / "model"),
        data=[str(tmp_path / "world" / "train.jsonl")],
        retriever=str(tmp_path / "world" / "corpus.jsonl"),
        out=str(out),
        limit=3,
        group_size=2,
        device="cpu",
    )
    earlier = ProbeResult("w:0", "q?", 1, 1, -0.5, -0.1, 0.2, 1.0, -0.3, 0.1, -0.4)
    out.mkdir()
    settings = {**_settings(cfg), "protocol": dataclasses.asdict(protocol)}
    lines = [
        {"settings": settings},
        {"index": 0, "result": dataclasses.asdict(earlier)},
        {"index": 1, "result": None},
        {"index": 2, "result": None},
    ]
    text = "\n".join(json.dumps(x) for x in lines) + "\n" + '{"index": 3, "resu'  # torn line
    (out / PARTIAL).write_text(text)
    summary, results = probe_model(cfg)
    # every question was already done: nothing is sampled again, the earlier result is kept
    assert results == [earlier] and summary["probed"] == 1 and summary["lld_share"] == 1.0
    assert json.loads((out / "probe.json").read_text())["settings"]["limit"] == 3
    assert not (out / PARTIAL).exists()
    # a larger --limit resumes the same partial probe; --max-probed 1 is already reached
    (out / PARTIAL).write_text(text)
    more = dataclasses.replace(cfg, limit=6, max_probed=1)
    assert probe_model(more)[1] == [earlier] and not (out / PARTIAL).exists()

    (out / PARTIAL).write_text(json.dumps({"settings": {**settings, "lr": 9.0}}) + "\n")
    with pytest.raises(UserInputError, match=PARTIAL):
        probe_model(cfg)
    # the same flags under another protocol (topk 3 instead of 2) sampled other rollouts
    (out / PARTIAL).write_text(text)
    with pytest.raises(UserInputError, match="'topk': 2"):
        probe_model(cfg, dataclasses.replace(protocol, topk=3))


def test_a_probe_of_chosen_questions_gives_their_results_without_sampling_the_others(
    small_world, world_tokenizer, world_retriever, monkeypatch
):
    model, _, ex, seed = _mixed_group(small_world, world_tokenizer, world_retriever)
    other = dataclasses.replace(ex, id="other")
    kwargs = dict(group_size=6, rollout=CFG, lr=1e-3, seed=seed, template=TEMPLATE)
    examples = [ex, other, ex]
    whole = run_probe(model, world_tokenizer, world_retriever, examples, progress=False, **kwargs)
    sampled = []
    generate = RolloutEngine.generate

    def counting(self, reqs, **kw):
        sampled.append((reqs[0].example_id, kw["generator"].initial_seed()))
        return generate(self, reqs, **kw)

    monkeypatch.setattr(RolloutEngine, "generate", counting)
    seen: list[tuple[int, ProbeResult | None]] = []
    chosen = run_probe(
        model, world_tokenizer, world_retriever, examples, progress=False, only={ex.id},
        on_question=lambda i, r: seen.append((i, r)), **kwargs,
    )  # fmt: skip
    # question 1 was passed over, not sampled; question 2 keeps the rollout seed of index 2
    assert sampled == [(ex.id, seed * 1_000_003), (ex.id, seed * 1_000_003 + 2)]
    assert [i for i, _ in seen] == [0, 1, 2] and seen[1][1] is None
    assert chosen == [r for r in whole if r.example_id == ex.id] and chosen  # question 0 mixed


def test_questions_from_an_earlier_probe_must_have_sampled_the_same_way(tmp_path) -> None:
    import json

    from llds.errors import UserInputError
    from llds.probe.one_step import ProbeConfig, _settings, probed_questions

    cfg = ProbeConfig(model=str(tmp_path / "m"), data=[str(tmp_path / "d.jsonl")], seed=3)
    earlier = ProbeResult("w:5", "q?", 1, 1, -0.5, -0.1, 0.2, 1.0, -0.3, 0.1, -0.4)
    path = tmp_path / "earlier" / "probe.json"
    path.parent.mkdir()
    # another update rule and lr, the same sampling; paths written relative to the folder
    settings = {**_settings(cfg), "updates": 1, "lr": 5.0, "model": "m", "data": ["d.jsonl"]}
    path.write_text(json.dumps({"settings": settings, "results": [dataclasses.asdict(earlier)]}))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        assert probed_questions(path.parent, dataclasses.replace(cfg, updates=4)) == {"w:5"}
        adamw = dataclasses.replace(cfg, optimizer="adamw", betas=(0.8, 0.99), weight_decay=0.0)
        assert probed_questions(path, adamw) == {"w:5"}  # the update rule samples nothing
        with pytest.raises(UserInputError, match="seed is 3"):
            probed_questions(path, dataclasses.replace(cfg, seed=4))
        with pytest.raises(UserInputError, match="temperature"):
            probed_questions(path, dataclasses.replace(cfg, temperature=0.7))
    # a recorded protocol must match too (files that lack one are not checked for it)
    with_protocol = {**settings, "protocol": {"topk": 2}}
    path.write_text(json.dumps({"settings": with_protocol, "results": []}))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        assert probed_questions(path, cfg, {"topk": 2}) == set()
        with pytest.raises(UserInputError, match="its protocol is"):
            probed_questions(path, cfg, {"topk": 3})
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UserInputError, match=r"bad\.json"):
        probed_questions(tmp_path / "bad.json", cfg)
    # the partial file of a probe of all questions does not mention the option
    assert "questions_from" not in _settings(cfg)
    assert _settings(dataclasses.replace(cfg, questions_from="x"))["questions_from"] == "x"
