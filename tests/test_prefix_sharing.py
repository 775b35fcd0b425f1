"""Prefix sharing in the no-grad scoring passes (`llds.policy.prompt_once`): each distinct
prompt computed once over the whole batch, the responses against its keys and values. Checked
against each row run alone through transformers' forward (a full log-softmax, no shared
code), on Llama-family models (llds's segment forward), on GPT-2 (transformers' forward with a
cache) and on LoRA models and their adapter-free reference."""

from __future__ import annotations

import pytest
import torch

from llds.models.segment_forward import Context, SegmentForward
from llds.policy import prompt_once
from llds.policy.forward import batched_log_probs, batched_log_probs_and_hidden
from llds.rollout.batch import Episode, RolloutBatch

VOCAB = 120


def _model(arch: str, seed: int = 0):
    """A random tiny model: Llama-family (qwen2, llama; qwen3 with its q/k norms) or GPT-2."""
    torch.manual_seed(seed)
    if arch == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2))
    if arch == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM

        sizes = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
        heads = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
        return Qwen3ForCausalLM(Qwen3Config(vocab_size=VOCAB, **sizes, **heads))
    from llds.models.tiny import tiny_causal_lm

    return tiny_causal_lm(VOCAB, hidden_size=32, num_layers=2, arch=arch, seed=seed)


def _batch(*, groups=(7, 11, 4, 9), group: int = 3, seed: int = 0) -> RolloutBatch:
    """Prompts of different lengths, `group` rows each with responses of different lengths and
    an observation between two actions; one extra row whose prompt nobody shares."""
    gen = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(3, VOCAB, (n,), generator=gen).tolist()

    def episode(prompt: list[int], name: str, turns: list[tuple[int, bool]]) -> Episode:
        ep = Episode(prompt_ids=prompt, example_id=name, group_id=name, golds=("x",))
        for n, action in turns:
            written = [0.0] * n if action else None
            ep.append(ids(n), action=action, logprobs=written, entropies=written)
        return ep

    episodes = [
        episode(prompt, str(k), [(2 + 3 * i + k, True), (3, False), (i + 1, True)])
        for k, prompt in enumerate(ids(n) for n in groups)
        for i in range(group)
    ]
    episodes.insert(4, episode(ids(5), "lone", [(1, True)]))  # a one-token response
    return RolloutBatch.from_episodes(episodes, pad_id=0)


def _rows_alone(model, batch: RolloutBatch, temperature: float = 1.0):
    """Log-probs, entropies and the pooled last hidden state of every row run alone and
    unpadded through the model's own forward."""
    p = batch.prompt_len
    logp, ent = torch.zeros(batch.loss_mask.shape), torch.zeros(batch.loss_mask.shape)
    pooled = []
    with torch.no_grad():
        for i in range(len(batch)):
            row = batch.input_ids[i][batch.attention_mask[i].bool()]
            n_prompt = int(batch.attention_mask[i, :p].sum())
            out = model(input_ids=row[None], output_hidden_states=True)
            lsm = torch.log_softmax(out.logits[0, n_prompt - 1 : -1].float() / temperature, -1)
            n = len(row) - n_prompt
            logp[i, :n] = lsm.gather(-1, row[n_prompt:, None]).squeeze(-1)
            ent[i, :n] = -(lsm.exp() * lsm).sum(-1)
            action = batch.loss_mask[i, :n].bool()
            pooled.append(out.hidden_states[-1][0, n_prompt:][action].mean(0))
    return logp, ent, torch.stack(pooled)


def _runner_calls(monkeypatch) -> list[tuple[str, int]]:
    """Record every prompt and tail call of the runners: (kind, tokens fed)."""
    calls: list[tuple[str, int]] = []
    for cls in (prompt_once.SegmentRunner, prompt_once.TransformersRunner):
        for kind in ("prompts", "tails"):
            real = getattr(cls, kind)

            def spy(self, ids, mask, *rest, _real=real, _kind=kind):
                calls.append((_kind, int(mask.sum())))
                return _real(self, ids, mask, *rest)

            monkeypatch.setattr(cls, kind, spy)
    return calls


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3", "gpt2"])
@pytest.mark.parametrize("budget", [40, 10**6])
def test_shared_prompts_give_every_rows_own_log_probs(arch, budget, monkeypatch):
    """Within 1e-5 of each row run alone, and of the whole-row path; every distinct prompt runs
    exactly once (the lone prompt too) and every response token once; the context columns get
    no log-prob."""
    model = _model(arch).eval()
    batch = _batch()
    real = batch.loss_mask.bool()
    want_lp, want_ent, _ = _rows_alone(model, batch, 0.7)
    calls = _runner_calls(monkeypatch)
    lp, ent = batched_log_probs(
        model, batch, budget, temperature=0.7, with_entropy=True, prefix_sharing=True
    )
    plain, _ = batched_log_probs(model, batch, budget, temperature=0.7, prefix_sharing=False)
    assert (lp[real] - want_lp[real]).abs().max() < 1e-5
    assert (ent[real] - want_ent[real]).abs().max() < 1e-5
    assert (lp[real] - plain[real]).abs().max() < 1e-5
    assert not lp[~real].any()
    p = batch.prompt_len
    prompt_lengths = {
        tuple(batch.input_ids[i, :p][batch.attention_mask[i, :p].bool()].tolist())
        for i in range(len(batch))
    }
    fed = {kind: sum(n for k, n in calls if k == kind) for kind in ("prompts", "tails")}
    assert fed["prompts"] == sum(len(t) for t in prompt_lengths)  # 5 prompts, once each
    # every response token once, but for the last column of each micro-batch's longest rows
    # (it predicts nothing)
    lengths = batch.attention_mask[:, p:].sum(-1).tolist()
    plan = prompt_once.tail_micro_batches(batch, budget)
    widest = [max(lengths[i] for i in rows) for rows in plan]
    assert sorted(i for rows in plan for i in rows) == list(range(len(batch)))
    assert fed["tails"] == sum(
        min(lengths[i], w - 1) for rows, w in zip(plan, widest, strict=True) for i in rows
    )
    assert (budget == 40) == (len(plan) > 1)
    kinds = {type(prompt_once.runner_for(model, None)).__name__}
    assert kinds == {"TransformersRunner" if arch == "gpt2" else "SegmentRunner"}


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_log_probs_and_pooled_hidden_from_the_shared_pass(arch):
    model = _model(arch, seed=1).eval()
    batch = _batch(seed=2)
    real = batch.loss_mask.bool()
    want_lp, _, want_pooled = _rows_alone(model, batch)
    lp, pooled = batched_log_probs_and_hidden(model, batch, 50, prefix_sharing=True)
    assert (lp[real] - want_lp[real]).abs().max() < 1e-5
    assert (pooled - want_pooled).abs().max() < 1e-5


def test_no_repeated_prompt_takes_the_whole_row_path(monkeypatch):
    model = _model("qwen2").eval()
    batch = _batch(group=1)
    calls = _runner_calls(monkeypatch)
    lp, _ = batched_log_probs(model, batch, 10**6, prefix_sharing=True)
    want, _, _ = _rows_alone(model, batch)
    real = batch.loss_mask.bool()
    assert calls == []
    assert (lp[real] - want[real]).abs().max() < 1e-5


def _lora(seed: int = 0):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        _model("qwen2", seed=seed), LoraConfig(r=4, target_modules=["q_proj", "v_proj", "up_proj"])
    )
    torch.manual_seed(seed + 1)
    with torch.no_grad():  # adapters that change the forward (peft starts B at 0)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.3)
    return model.eval()


def test_lora_policy_and_its_adapter_free_reference():
    """The LoRA policy's shared pass runs its adapters; the reference (`WithoutAdapters`)
    runs the same layers with them off: each equals its own model's rows run alone, and the two
    differ."""
    from llds.policy.lora import WithoutAdapters

    model = _lora()
    batch = _batch(seed=3)
    real = batch.loss_mask.bool()
    reference = WithoutAdapters(model)
    assert isinstance(prompt_once.runner_for(model, None), prompt_once.SegmentRunner)
    assert isinstance(prompt_once.runner_for(reference, None), prompt_once.SegmentRunner)
    lp, _ = batched_log_probs(model, batch, 60, prefix_sharing=True)
    ref_lp, _ = batched_log_probs(reference, batch, 60, prefix_sharing=True)
    want, _, _ = _rows_alone(model, batch)
    with model.disable_adapter():
        want_ref, _, _ = _rows_alone(model, batch)
    assert (lp[real] - want[real]).abs().max() < 1e-5
    assert (ref_lp[real] - want_ref[real]).abs().max() < 1e-5
    assert (want[real] - want_ref[real]).abs().max() > 1e-2


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_segment_forward_gradients_equal_the_whole_row_forward(arch):
    """With autograd on (one SDPA over the context and the segment), a loss on the response
    states after a shared prompt has the gradient of running each whole row."""
    model = _model(arch, seed=4)
    seg = SegmentForward(model)
    torch.manual_seed(5)
    prompt, tails = torch.randint(3, VOCAB, (1, 6)), torch.randint(3, VOCAB, (2, 4))
    weights = torch.randn(2, 4, 32)

    def whole_rows() -> list[torch.Tensor]:
        model.zero_grad()
        rows = torch.cat([prompt.expand(2, -1), tails], dim=1)
        hidden = model.model(input_ids=rows).last_hidden_state[:, 6:]
        (hidden * weights).sum().backward()
        return [p.grad.clone() for p in model.model.parameters()]

    def shared() -> list[torch.Tensor]:
        model.zero_grad()
        _, kv = seg(prompt, torch.zeros(1, dtype=torch.long), None, keep_kv=True)
        visible = torch.ones(1, 6, dtype=torch.bool)
        context = Context([k for k, _ in kv], [v for _, v in kv], visible, torch.zeros(2).long())
        hidden, _ = seg(tails, torch.full((2,), 6), context)
        (hidden * weights).sum().backward()
        return [p.grad.clone() for p in model.model.parameters()]

    want, got = whole_rows(), shared()
    assert any(g.abs().sum() > 0 for g in got)
    for g, w in zip(got, want, strict=True):  # float rounding, relative to the gradient's size
        assert (g - w).abs().max() <= 1e-5 * w.abs().max()
