"""LLDS inside TRL's GRPOTrainer (trl 1.16): the loss added through TRL's own tensors equals
`llds.algo.llds_loss` in value and gradient, and a short run with our multi-turn search rollout
works end to end."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

pytest.importorskip("trl")  # the `trl` extra (installed by `make test`)
from conftest import make_tiny_model, tag_happy
from llds.algo import llds_loss
from llds.integrations.trl import (
    GROUP_ACC_KEY,
    GROUP_KEY,
    INACTIVE_WARNING,
    REWARD_KEY,
    LLDSGRPOConfig,
    LLDSGRPOTrainer,
    generation_metrics,
    gold_answers,
    llds_can_act,
    premb_share_parts,
    search_r1_reward,
    search_r1_rows,
    search_rollout_func,
)
from llds.rollout import RolloutConfig

pytestmark = pytest.mark.filterwarnings("ignore:You are using 'rollout_func'")

SHORT_TEMPLATE = "Question: {question}\nAnswer: "  # short prompts keep the tiny run fast


def _rows(world, n=4):
    return search_r1_rows(world.train[:n], SHORT_TEMPLATE)


def _trainer(
    tmp_path, tokenizer, model, rows, *, rollout_func=None, reward_funcs=None, **overrides
):
    from datasets import Dataset

    settings = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        gradient_accumulation_steps=1,
        steps_per_generation=2,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,  # exact fp32 on CPU (TRL defaults to bf16 autocast)
        temperature=1.0,
        seed=0,
        disable_tqdm=True,
    )
    settings.update(overrides)
    return LLDSGRPOTrainer(
        model=model,
        reward_funcs=reward_funcs or search_r1_reward(),
        args=LLDSGRPOConfig(**settings),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )


def _reference_logps(model, input_ids, attention_mask, completion_len):
    """log pi(token) of the completion tokens with a plain forward pass (not TRL's code)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    logits = logits[:, -completion_len - 1 : -1, :].float()
    targets = input_ids[:, -completion_len:]
    return torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def _trl_inputs(tokenizer, vocab):
    """The micro-batch dict TRL's `_compute_loss` receives after a multi-turn rollout."""
    g = torch.Generator().manual_seed(11)
    b, p, c = 4, 5, 10
    prompt_ids = torch.randint(3, vocab, (b, p), generator=g)
    prompt_mask = torch.ones(b, p, dtype=torch.long)
    prompt_mask[1, :2] = 0  # left padding
    prompt_ids[1, :2] = tokenizer.pad_token_id
    completion_ids = torch.randint(3, vocab, (b, c), generator=g)
    lengths = [10, 8, 10, 6]
    completion_mask = torch.zeros(b, c, dtype=torch.long)
    for i, n in enumerate(lengths):
        completion_mask[i, :n] = 1
        completion_ids[i, n:] = tokenizer.pad_token_id
    tool_mask = torch.ones(b, c, dtype=torch.long)
    tool_mask[0, 3:6] = 0  # observation between two actions
    tool_mask[1, 2:4] = 0
    tool_mask[3, 1:3] = 0
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": torch.tensor([1.0, -0.5, 0.0, 0.7]),
        "num_items_in_batch": (completion_mask * tool_mask).sum().float() * 2,
    }


def _grads(model):
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean"])
def test_llds_through_trl_loss_matches_algo_value_and_gradient(
    tmp_path, world_tokenizer, small_world, aggregation
):
    model = make_tiny_model(world_tokenizer, seed=1)
    trainer = _trainer(
        tmp_path,
        world_tokenizer,
        model,
        _rows(small_world),
        llds_aggregation=aggregation,
        llds_coef=0.5,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2  # TRL sets this inside its training loop
    inputs = _trl_inputs(world_tokenizer, len(world_tokenizer))
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    c = inputs["completion_ids"].shape[1]
    with torch.no_grad():
        current = _reference_logps(model, ids, attn, c)
    # pi_old differs from pi_theta: d = old - current has both signs, and observation tokens
    # carry large positive d that must NOT be penalized (the env mask removes them).
    shift = torch.linspace(-0.6, 0.9, c).expand(4, c).clone()
    shift[inputs["tool_mask"] == 0] = 3.0
    inputs["old_per_token_logps"] = current + shift

    def loss_and_grads(coef):
        trainer.args.llds_coef = coef
        model.zero_grad(set_to_none=True)
        loss = trainer._compute_loss(model, inputs)
        loss.backward()
        return loss.detach(), _grads(model)

    with_llds, g_with = loss_and_grads(0.5)
    without, g_without = loss_and_grads(0.0)

    # Expected: llds.algo on the same tensors, with pi_theta from TRL's own forward pass
    model.zero_grad(set_to_none=True)
    logps, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, attn, c)
    real = inputs["completion_mask"].bool()
    torch.testing.assert_close(logps.detach()[real], current[real], rtol=0, atol=1e-5)
    mask = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
    if aggregation == "token-mean":  # TRL's 'dapo' normalizer: tokens of one accumulation window
        expected, _ = llds_loss(
            logps,
            inputs["old_per_token_logps"],
            inputs["advantages"],
            mask,
            coef=0.5,
            aggregation=aggregation,
            num_tokens=inputs["num_items_in_batch"] * 2 / 2,
        )
    else:
        expected, _ = llds_loss(
            logps,
            inputs["old_per_token_logps"],
            inputs["advantages"],
            mask,
            coef=0.5,
            aggregation=aggregation,
        )
        expected = expected / 2  # gradient accumulation, as TRL scales its own loss
    expected.backward()
    g_expected = _grads(model)
    expected = expected.detach()

    assert float(expected) > 1e-3  # the case is not vacuous
    torch.testing.assert_close(with_llds - without, expected, rtol=1e-4, atol=1e-6)
    for a, b, e in zip(g_with, g_without, g_expected, strict=True):
        torch.testing.assert_close(a - b, e, rtol=1e-3, atol=1e-6)

    # the same penalty without the env mask would differ: the test sees the mask
    unmasked, _ = llds_loss(
        logps.detach(),
        inputs["old_per_token_logps"],
        inputs["advantages"],
        inputs["completion_mask"].bool(),
        coef=0.5,
        aggregation=aggregation,
    )
    assert not torch.isclose(unmasked / 2, expected, rtol=1e-3)

    metrics = trainer._metrics["train"]
    assert metrics["llds/active"] == [1.0, 0.0]  # the pass at lambda 0.5, then at 0: off
    assert metrics["llds/loss"][0] == pytest.approx(
        float(expected) * (1 if aggregation == "token-mean" else 2), rel=1e-4
    )


def test_without_old_logps_llds_is_zero(tmp_path, world_tokenizer, small_world):
    model = make_tiny_model(world_tokenizer, seed=2)
    trainer = _trainer(tmp_path, world_tokenizer, model, _rows(small_world), llds_coef=1.0)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs = _trl_inputs(world_tokenizer, len(world_tokenizer))  # no old_per_token_logps
    trainer.args.llds_coef = 1.0
    with_llds = trainer._compute_loss(model, inputs).detach()
    trainer.args.llds_coef = 0.0
    without = trainer._compute_loss(model, inputs).detach()
    assert float(with_llds) == float(without)
    assert trainer._metrics["train"]["llds/active"] == [0.0, 0.0]


@pytest.mark.parametrize(
    ("ga", "spg", "iters", "acts"),
    [
        (1, 1, 1, False),
        (4, 4, 1, False),
        (4, 2, 1, False),
        (1, 4, 1, True),
        (2, 2, 2, True),
        (4, 3, 1, True),
        (8, 2, 2, False),
    ],
)
def test_llds_can_act_follows_trl_old_logp_rule(ga, spg, iters, acts):
    # hand-checked: one optimizer step per generation batch <=> GA divisible by spg * iters
    assert llds_can_act(ga, spg, iters) is acts


def test_warns_when_llds_can_never_act(tmp_path, world_tokenizer, small_world):
    model = make_tiny_model(world_tokenizer, seed=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer(tmp_path, world_tokenizer, model, _rows(small_world), steps_per_generation=1)
    texts = [str(w.message) for w in caught]
    assert any("LLDS can never" in t and "num_iterations > 1" in t for t in texts)
    assert "steps_per_generation" in INACTIVE_WARNING


def test_gold_answers_formats():
    assert gold_answers("Paris") == ("Paris",)
    assert gold_answers(["a", "b"]) == ("a", "b")
    assert gold_answers({"style": "rule", "ground_truth": {"target": ["x"]}}) == ("x",)
    with pytest.raises(Exception, match="gold answers"):
        gold_answers([1, 2])


def test_search_r1_reward_scores_the_final_answer_action():
    from llds.env import FormatRewardConfig, invalid_action_message

    stitched = "<answer> Paris" + invalid_action_message() + " </answer>"
    valid = "<think>t</think><answer> Paris </answer>"
    golds = {"golden_answers": [["Paris"], ["Paris"]]}
    em = search_r1_reward()
    fmt = search_r1_reward(format_reward=FormatRewardConfig(enabled=True))
    # search_rollout_func's final_answer: None when the rollout did not end with an answer
    fields = {"response_text": [stitched, valid], "final_answer": [None, "Paris"]}
    assert em(["", ""], **fields, **golds) == [0.0, 1.0]
    assert fmt(["", ""], **fields, **golds) == [0.0, 1.0]
    # plain completions (no rollout fields): the last complete answer span of the text
    assert em([stitched, valid], **golds) == [1.0, 1.0]
    assert fmt([stitched, valid], **golds) == [pytest.approx(0.8), 1.0]


def test_two_step_run_with_search_rollout_func(
    tmp_path, world_tokenizer, small_world, world_retriever
):
    model = tag_happy(make_tiny_model(world_tokenizer, seed=0), world_tokenizer, bias=5.0)
    before = [p.detach().clone() for p in model.parameters()]
    inner = search_rollout_func(
        world_retriever,
        RolloutConfig(
            max_turns=2,
            max_turn_tokens=10,
            max_obs_tokens=24,
            max_total_tokens=200,
            topk=1,
            temperature=1.0,
        ),
        generator=torch.Generator().manual_seed(0),
    )
    seen = []

    def rollout(prompts, trainer):
        out = inner(prompts, trainer)
        seen.append((list(prompts), out))
        return out

    def fewer_invalid(completions, num_invalid, **kwargs):  # a rollout field, as a reward
        return [-float(n) for n in num_invalid]

    rows = _rows(small_world, n=4)
    trainer = _trainer(
        tmp_path,
        world_tokenizer,
        model,
        rows,
        rollout_func=rollout,
        reward_funcs=[search_r1_reward(), fewer_invalid],
        llds_coef=0.2,
        llds_mask_answer=True,
    )
    trainer.train()

    assert len(seen) == 1  # steps_per_generation=2: one generation batch feeds both steps
    prompts, out = seen[0]
    assert len(prompts) == 8 and len(out["completion_ids"]) == 8
    assert prompts[0] == prompts[1] and prompts[2] == prompts[3]  # TRL repeats each prompt G=2x
    env_mask = out["env_mask"]
    assert all(len(m) == len(c) for m, c in zip(env_mask, out["completion_ids"], strict=True))
    assert any(0 in m for m in env_mask)  # some rollouts searched: observation tokens present
    # the final answer reaches the reward function; it exists exactly when an answer span is masked
    assert len(out["final_answer"]) == 8
    for answer, mask in zip(out["final_answer"], out["answer_mask"], strict=True):
        assert (answer is not None) == any(mask)

    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    # TRL counts only env_mask = 1 tokens as completion length: the env mask reached TRL
    action_tokens = [sum(m) for m in env_mask]
    assert logs[0]["completions/mean_length"] == pytest.approx(sum(action_tokens) / 8)
    for h in logs:
        assert "llds/gate_frac" in h and "lld/logp_first_action" in h
    # step 1 runs on pi_old itself: d is at most rounding noise, and LLDS is exactly 0 there
    # (llds_first_update="zero"); step 2 on the same rollouts after one update: LLDS acts
    assert [h["llds/active"] for h in logs] == [0.0, 1.0]
    assert logs[0]["llds/value"] == 0.0 and logs[0]["llds/gate_frac"] == 0.0
    assert logs[1]["llds/value"] > 1e-3
    assert logs[1]["lld/disp_incorrect"] is not None  # displacement is measured once pi moved
    assert "lld/disp_incorrect" not in logs[0]
    # the monitor's metrics through TRL's logs: LLD shares on what TRL's loss sees (step 2: pi
    # after step 1 vs pi_old), pooled from their counts; turns from the rollout's fields
    assert "lld/premb_share_pos_fell" not in logs[0]  # step 1: pi is pi_old, nothing measured
    n_pos = logs[1]["lld/premb_n_pos"]
    assert n_pos == logs[1]["lld/pos_responses"]  # the same positive rows as the native keys
    assert logs[1]["lld/premb_n_pos_acc_lo"] + logs[1]["lld/premb_n_pos_acc_hi"] == n_pos
    assert ("lld/premb_share_pos_fell" in logs[1]) == (n_pos > 0)  # no share over nothing
    turns = list(out["num_turns"])
    assert logs[0]["turns/per_rollout"] == pytest.approx(sum(turns) / 8)
    void = sum(1 for v in out["num_void_turns"] if v > 0) / 8
    assert logs[0]["turns/void_share"] == pytest.approx(void)
    assert logs[0]["turns/valid_search_share"] == pytest.approx(
        sum(out["num_valid_searches"]) / sum(turns)
    )
    # TRL logs the searches the search-decline rule reads
    searches = list(out["num_valid_searches"])
    assert logs[0]["rollout/valid_searches"] == pytest.approx(sum(searches) / 8)
    # the rollout returns the sampler's log-probs (None on observation tokens): TRL keeps them,
    # and the mismatch against its recomputed pi_old is measured; the sampler is the trained
    # model itself here, so the mismatch is float noise
    assert all(
        (lp is None) == (m == 0)
        for lps, ms in zip(out["logprobs"], env_mask, strict=True)
        for lp, m in zip(lps, ms, strict=True)
    )
    assert 0 <= logs[0]["mismatch/abs_logp_diff_max"] < 1e-3
    assert abs(logs[0]["mismatch/k3_kl"]) < 1e-6
    # a tie is not a fall: on the generation batch's first step pi is pi_old, and the
    # displacement is not measured (absent), not 0 with every response counted as fallen
    assert "lld/frac_pos_fell" not in logs[0] and "lld/disp_pos" not in logs[0]
    assert "lld/disp_pos" in logs[1]
    after = list(model.parameters())
    assert any(not torch.equal(a.detach(), b) for a, b in zip(after, before, strict=True))

    # `llds report` reads this real TRL output directory (its trainer_state.json, as TRL writes
    # it on every save) in the report's names, and draws a report from it
    from llds.report.html import write_report
    from llds.report.sources import find_source, read_source

    trainer.state.save_to_json(str(tmp_path / "trainer_state.json"))
    source = find_source(tmp_path)
    assert source.kind == "trl"
    rows = read_source(source)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1]["llds/gate_frac"] == logs[1]["llds/gate_frac"]
    assert rows[0]["turns/void_share"] == logs[0]["turns/void_share"]
    assert rows[0]["reward/mean"] == pytest.approx(logs[0]["reward"])
    report = write_report([tmp_path], tmp_path / "report")
    summary = json.loads((report.parent / "report.json").read_text())["runs"][0]
    assert summary["source"] == "trl" and summary["steps"] == 2
    assert "Training curves" in report.read_text(encoding="utf-8")


def test_llds_fields_are_generated_from_the_one_definition():
    import dataclasses
    import typing

    from llds.algo import LLDSConfig
    from llds.config.algo import engine_fields

    ours = dataclasses.asdict(LLDSConfig())
    trl_fields = {f.name: f for f in dataclasses.fields(LLDSGRPOConfig)}
    hints = typing.get_type_hints(LLDSGRPOConfig)
    # the static class declares every field of the one definition, with its type (editors and
    # TRL's argument parser see them), its default and its help
    for name, kind, spec in engine_fields("llds_"):
        assert name in trl_fields, name
        assert hints[name] == kind, name
        assert trl_fields[name].default == spec.default, name
        assert trl_fields[name].metadata["help"] == spec.metadata["help"], name
    for name, default in ours.items():
        assert trl_fields[f"llds_{name}"].default == default, name
        assert trl_fields[f"llds_{name}"].metadata["help"], name  # help from the docstring


def test_llds_settings_are_validated_and_named_like_trl_arguments(tmp_path):
    from transformers import HfArgumentParser

    from llds.errors import ConfigError

    cpu = {"output_dir": str(tmp_path), "use_cpu": True, "bf16": False}
    (args,) = HfArgumentParser(LLDSGRPOConfig).parse_args_into_dataclasses(
        [
            "--output_dir",
            str(tmp_path),
            "--use_cpu",
            "--bf16",
            "false",
            "--llds_gate",
            "token",
            "--llds_coef",
            "0.3",
        ]
    )
    assert (args.llds.gate, args.llds.coef, args.llds.aggregation) == (
        "token",
        0.3,
        "seq-mean-token-mean",
    )
    with pytest.raises(ConfigError, match=r"^llds_gate: "):
        LLDSGRPOConfig(**cpu, llds_gate="sentence")
    with pytest.raises(ConfigError, match=r"^llds_coef: "):
        LLDSGRPOConfig(**cpu, llds_coef=-1.0)
    off = LLDSGRPOConfig(**cpu, llds_enabled=False)
    assert off.llds.active_coef == 0.0
    # the native trainer's scope=batch needs the whole rollout batch in each loss: refused here
    with pytest.raises(ConfigError, match=r"^llds_scope: 'batch' needs the rest"):
        LLDSGRPOConfig(**cpu, llds_scope="batch")


def test_generation_metrics_by_hand():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    sampled = torch.log(torch.tensor([[0.5, 0.5, 0.1], [0.25, 0.5, 1.0]]))
    trained = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.5, 0.5, 0.5]]))
    out = {"completion_mask": mask, "sampling_per_token_logps": sampled}
    extra = {"num_turns": [2, 3], "num_void_turns": [0, 1], "num_valid_searches": [1, 1]}
    only_turns = generation_metrics(out, extra)  # no old log-probs: no mismatch keys
    assert only_turns == {
        "turns/per_rollout": 2.5,
        "turns/void_share": 0.5,
        "turns/valid_search_share": 2 / 5,
        "rollout/valid_searches": 1.0,  # 2 valid searches over 2 rollouts
    }
    out["old_per_token_logps"] = trained
    # token-truncated ratios at cap 1.5: raw rho = 1, 0.5, (masked), 2, 1, 0.5 -> 2 is clipped
    rho = torch.exp(trained - sampled)
    out["importance_sampling_ratio"] = rho.clamp(max=1.5)
    got = generation_metrics(out, {})
    # masked tokens' log rho: 0, -ln 2, ln 2, 0, -ln 2; k3 = rho - 1 - log rho
    ln2 = float(torch.log(torch.tensor(2.0)))
    assert got["mismatch/abs_logp_diff_max"] == pytest.approx(ln2)
    assert got["mismatch/abs_logp_diff_mean"] == pytest.approx(3 * ln2 / 5)
    assert got["mismatch/k3_kl"] == pytest.approx(((-0.5 + ln2) * 2 + (1 - ln2)) / 5)
    assert got["mismatch/is_weight_mean"] == pytest.approx((1 + 0.5 + 1.5 + 1 + 0.5) / 5)
    assert got["mismatch/is_clipped_frac"] == pytest.approx(1 / 5)


def test_premb_share_parts_by_hand():
    mask = torch.ones(4, 2, dtype=torch.long)
    old = torch.zeros(4, 2)
    current = torch.tensor([[-0.2, 0.1], [0.3, 0.0], [-0.5, 0.0], [0.1, 0.1]])
    inputs = {
        "completion_mask": mask,
        "old_per_token_logps": old,
        "advantages": torch.tensor([1.0, 1.0, 1.0, -1.0]),
        REWARD_KEY: torch.tensor([1.0, 1.0, 1.0, 0.0]),
        GROUP_KEY: torch.tensor([0, 0, 1, 1]),
        # group accuracy over the whole generation batch, not just these rows
        GROUP_ACC_KEY: torch.tensor([0.75, 0.75, 0.25, 0.25]),
    }
    got = premb_share_parts(current, inputs)
    # positive rows 0 (sum -0.1, fell, group hi), 1 (+0.3, hi), 2 (-0.5, fell, group lo)
    assert got["lld/n_pos"] == 3.0 and got["lld/share_pos_fell"] == pytest.approx(2 / 3)
    assert got["lld/share_pos_fell_acc_hi"] == 0.5 and got["lld/share_pos_fell_acc_lo"] == 1.0


@pytest.mark.parametrize("first_update", ["zero", "computed"])
def test_the_llds_term_follows_the_first_update_rule(tmp_path, first_update):
    """Before the policy moved, `first_update: zero` uses pi_old = pi_theta (the term exactly 0);
    `computed` keeps TRL's old log-probs (the authors' behaviour), the term `llds_loss` gives
    on them; once moved, both use TRL's old log-probs."""
    from llds.integrations.trl import trl_llds_loss

    gen = torch.Generator().manual_seed(0)
    logp = (-torch.rand(3, 5, generator=gen)).requires_grad_()
    old = logp.detach() + 0.1 * torch.rand(3, 5, generator=gen)  # pi_theta fell below pi_old
    inputs = {
        "completion_mask": torch.ones(3, 5, dtype=torch.long),
        "old_per_token_logps": old,
        "advantages": torch.tensor([1.0, 0.5, -1.0]),
    }
    args = LLDSGRPOConfig(
        output_dir=str(tmp_path),
        llds_coef=0.5,
        llds_first_update=first_update,
        report_to="none",
        use_cpu=True,
        bf16=False,
    )
    expected, _ = llds_loss(
        logp, old, inputs["advantages"], torch.ones(3, 5, dtype=torch.bool), coef=0.5
    )
    assert expected.item() > 0
    before, _ = trl_llds_loss(logp, inputs, args, moved=False)
    after, _ = trl_llds_loss(logp, inputs, args, moved=True)
    assert after.item() == pytest.approx(expected.item())
    want = expected.item() if first_update == "computed" else 0.0
    assert before.item() == pytest.approx(want)
