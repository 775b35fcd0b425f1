"""Response log-probs with each distinct prompt run once (`_shared_prompt_outputs`) and with the
LM head on the model-written tokens only, against the plain whole-row forward and against a
per-row full log-softmax: same values, same gradients, and a clean fallback where a shared
prompt cache or a split head cannot be used."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import make_tiny_model
from llds.models.hf import enable_activation_checkpointing
from llds.models.kv_cache import NEW_NAME, OLD_NAME, returned_cache
from llds.policy import forward as forward_mod
from llds.policy.forward import batched_log_probs, pooled_response_hidden, response_log_probs
from llds.rollout.batch import Episode, RolloutBatch


def _batch(vocab: int, pad_id: int, *, group: int = 3, seed: int = 0) -> RolloutBatch:
    """Prompts of different lengths (so left padding differs), `group` rows per prompt with
    responses of different lengths (right padding), observation tokens in the middle."""
    gen = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(5, vocab, (n,), generator=gen).tolist()

    episodes = []
    for k, p_len in enumerate((7, 11, 4)):
        prompt = ids(p_len)
        for i in range(group):
            ep = Episode(prompt_ids=prompt, example_id=str(k), group_id=str(k), golds=("x",))
            n = 3 + 2 * i + k
            ep.append(ids(n), action=True, logprobs=[0.0] * n, entropies=[0.0] * n)
            ep.append(ids(2), action=False)
            ep.append(ids(i + 1), action=True, logprobs=[0.0] * (i + 1), entropies=[0.0] * (i + 1))
            episodes.append(ep)
    return RolloutBatch.from_episodes(episodes, pad_id)


def _per_row_reference(model, batch: RolloutBatch, temperature: float):
    """Each row alone, unpadded, full log-softmax: shares no code with `response_log_probs`."""
    p = batch.prompt_len
    logp = torch.zeros(batch.loss_mask.shape)
    ent = torch.zeros(batch.loss_mask.shape)
    for i in range(len(batch)):
        real = batch.attention_mask[i].bool()
        row = batch.input_ids[i][real]
        n_prompt = int(batch.attention_mask[i, :p].sum())
        logits = model(input_ids=row[None]).logits[0, n_prompt - 1 : -1].float() / temperature
        lsm = torch.log_softmax(logits, dim=-1)
        n = len(row) - n_prompt
        logp[i, :n] = lsm.gather(-1, row[n_prompt:, None]).squeeze(-1)
        ent[i, :n] = -(lsm.exp() * lsm).sum(-1)
    return logp, ent


def _plain(monkeypatch):
    monkeypatch.setattr(forward_mod, "_shared_prompt_outputs", lambda *a, **k: None)


def _loss_and_grads(model, batch, temperature=0.8, actions_only=True):
    """A loss touching log-probs and entropy of every model-written token, and its gradient."""
    model.zero_grad(set_to_none=True)
    lp, ent = response_log_probs(
        model, batch, temperature=temperature, with_entropy=True, actions_only=actions_only
    )
    real = batch.loss_mask.float()
    weights = torch.linspace(-1.0, 1.0, lp.numel()).view_as(lp)
    loss = (lp * weights * real).sum() + 0.1 * (ent * real).sum()
    loss.backward()
    return lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()]


def _spy(monkeypatch) -> list[bool]:
    """Record whether each `_shared_prompt_outputs` call took the shared path."""
    taken: list[bool] = []
    real = forward_mod._shared_prompt_outputs

    def spy(*a, **k):
        out = real(*a, **k)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(forward_mod, "_shared_prompt_outputs", spy)
    return taken


def test_shared_prompt_pass_gives_the_same_log_probs_and_gradients(world_tokenizer, monkeypatch):
    model = make_tiny_model(world_tokenizer, seed=3)
    model.train()
    batch = _batch(len(world_tokenizer), world_tokenizer.pad_token_id)
    assert len(set(batch.attention_mask[:, : batch.prompt_len].sum(-1).tolist())) == 3
    real = batch.loss_mask.bool()

    with monkeypatch.context() as m:
        taken = _spy(m)
        lp, ent, grads = _loss_and_grads(model, batch)
    assert taken == [True]
    with monkeypatch.context() as m:
        _plain(m)
        lp0, ent0, grads0 = _loss_and_grads(model, batch)
    with torch.no_grad():
        ref_lp, ref_ent = _per_row_reference(model, batch, 0.8)

    for got in (lp, lp0):
        assert torch.allclose(got[real], ref_lp[real], atol=1e-5)
    for got in (ent, ent0):
        assert torch.allclose(got[real], ref_ent[real], atol=1e-5)
    assert any(g.abs().sum() > 0 for g in grads)
    for g, g0 in zip(grads, grads0, strict=True):
        assert torch.allclose(g, g0, rtol=1e-4, atol=1e-6)


def test_no_grad_micro_batches_match_the_reference(world_tokenizer):
    model = make_tiny_model(world_tokenizer, seed=4).eval()
    batch = _batch(len(world_tokenizer), world_tokenizer.pad_token_id, group=4, seed=1)
    real = batch.loss_mask.bool()
    with torch.no_grad():
        ref_lp, ref_ent = _per_row_reference(model, batch, 1.0)
    for budget in (60, 10**6):  # a few rows per micro-batch, and all rows at once
        lp, ent = batched_log_probs(model, batch, budget, with_entropy=True)
        assert torch.allclose(lp[real], ref_lp[real], atol=1e-5)
        assert torch.allclose(ent[real], ref_ent[real], atol=1e-5)
        assert not lp[~real].any() and not ent[~real].any()  # context columns: no head, 0


def test_gradient_checkpointing_falls_back_to_the_plain_pass(world_tokenizer, monkeypatch):
    model = make_tiny_model(world_tokenizer, seed=5)
    batch = _batch(len(world_tokenizer), world_tokenizer.pad_token_id)
    model.train()
    _, _, grads0 = _loss_and_grads(model, batch, actions_only=False)
    enable_activation_checkpointing(model)
    taken = _spy(monkeypatch)
    _, _, grads = _loss_and_grads(model, batch)
    assert taken == [False]
    for g, g0 in zip(grads, grads0, strict=True):
        assert torch.allclose(g, g0, rtol=1e-4, atol=1e-6)


class _NoSelectCache:
    """A cache that cannot be gathered to rows (no `batch_select_indices`)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def get_seq_length(self) -> int:
        return self.inner.get_seq_length()


class _Wrapped(torch.nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, **kwargs):
        out = self.model(**kwargs)
        cache = returned_cache(out)
        if cache is not None:
            field = NEW_NAME if NEW_NAME in {f.name for f in dataclasses.fields(out)} else OLD_NAME
            setattr(out, field, _NoSelectCache(cache))
        return out


@pytest.mark.parametrize("grad", [False, True])
def test_a_cache_without_batch_select_falls_back(world_tokenizer, monkeypatch, grad):
    model = make_tiny_model(world_tokenizer, seed=6)
    batch = _batch(len(world_tokenizer), world_tokenizer.pad_token_id)
    real = batch.attention_mask[:, batch.prompt_len :].bool()
    taken = _spy(monkeypatch)
    with torch.set_grad_enabled(grad):
        lp, _ = response_log_probs(_Wrapped(model), batch)
        ref, _ = _per_row_reference(model, batch, 1.0)
    assert taken == [False]
    assert torch.allclose(lp[real], ref[real], atol=1e-5)


def test_pooled_response_hidden_matches_rows_run_alone(world_tokenizer) -> None:
    """Each row alone and unpadded, the last layer's hidden states averaged over its action
    tokens by hand; a tight token budget forces several micro-batches with different padding."""
    model = make_tiny_model(world_tokenizer).eval()
    batch = _batch(len(world_tokenizer), world_tokenizer.pad_token_id)
    got = pooled_response_hidden(model, batch, token_budget=40)
    p = batch.prompt_len
    for i in range(len(batch)):
        real = batch.attention_mask[i].bool()
        row = batch.input_ids[i][real]
        n_prompt = int(batch.attention_mask[i, :p].sum())
        with torch.no_grad():
            hidden = model(input_ids=row[None], output_hidden_states=True).hidden_states[-1][0]
        n = len(row) - n_prompt
        action = batch.loss_mask[i, :n].bool()
        want = hidden[n_prompt:][action].mean(0)
        assert torch.allclose(got[i], want, atol=1e-4), i


@pytest.mark.parametrize("shared", [True, False])
def test_head_on_written_tokens_only_matches_the_full_head(world_tokenizer, monkeypatch, shared):
    """The same log-probs, entropies and gradients as the LM head over every response column
    (`actions_only=False`), zeros on the columns the model did not write, and a head call that
    sees exactly the written tokens."""
    model = make_tiny_model(world_tokenizer, seed=7)
    model.train()
    batch = _batch(len(world_tokenizer), world_tokenizer.pad_token_id)
    written = batch.loss_mask.bool()
    context = batch.attention_mask[:, batch.prompt_len :].bool() & ~written
    assert context.any()  # the batch has observation tokens the head can skip
    if not shared:
        _plain(monkeypatch)
    rows_seen: list[int] = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda mod, args, out: rows_seen.append(args[0].shape[0])
    )
    lp, ent, grads = _loss_and_grads(model, batch)
    hook.remove()
    lp0, ent0, grads0 = _loss_and_grads(model, batch, actions_only=False)
    assert rows_seen == [int(written.sum())]
    assert torch.allclose(lp[written], lp0[written], atol=1e-5)
    assert torch.allclose(ent[written], ent0[written], atol=1e-5)
    assert not lp[~written].any() and not ent[~written].any()
    assert lp0[context].abs().sum() > 0  # the full head did compute them
    for g, g0 in zip(grads, grads0, strict=True):
        assert torch.allclose(g, g0, rtol=1e-4, atol=1e-6)


def test_split_lm_head_only_for_a_plain_linear_head(world_tokenizer) -> None:
    """The split needs a backbone without a head of its own and a linear head; a peft model is
    unwrapped to its base model, whose layers carry the adapters."""
    from peft import LoraConfig, get_peft_model

    from llds.policy.forward import split_lm_head

    model = make_tiny_model(world_tokenizer, seed=8)
    backbone, head = split_lm_head(model)
    assert backbone is model.model and head is model.lm_head
    model.config.final_logit_softcapping = 30.0  # logits are no longer a linear map
    assert split_lm_head(model) is None
    del model.config.final_logit_softcapping
    assert split_lm_head(_Wrapped(model)) is None  # no head to split off
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    backbone, _ = split_lm_head(peft_model)
    assert any("lora_A" in name for name, _ in backbone.named_parameters())


@pytest.mark.parametrize("shared", [True, False])
def test_log_probs_and_pooled_hidden_from_one_pass(world_tokenizer, monkeypatch, shared) -> None:
    """One forward gives what the two separate passes give (each checked above against rows run
    alone): with the shared-prompt pass (one micro-batch, so prompts repeat in it) and with the
    plain pass over several micro-batches. A model whose head cannot be split off gets None
    (two passes then)."""
    model = make_tiny_model(world_tokenizer, seed=3).eval()
    batch = _batch(len(world_tokenizer), world_tokenizer.pad_token_id)
    budget = 10_000 if shared else 40
    if not shared:
        _plain(monkeypatch)
    calls: list[int] = []
    hook = model.model.register_forward_hook(lambda mod, args, out: calls.append(1))
    both = forward_mod.batched_log_probs_and_hidden(model, batch, budget, temperature=0.8)
    n_calls = len(calls)
    hook.remove()
    assert both is not None
    lp, pooled = both
    lp0, _ = batched_log_probs(model, batch, budget, temperature=0.8)
    pooled0 = pooled_response_hidden(model, batch, budget)
    written = batch.loss_mask.bool()
    assert torch.allclose(lp[written], lp0[written], atol=1e-5)
    assert not lp[~written].any()
    assert torch.allclose(pooled, pooled0, atol=1e-5)
    n_micro = len(forward_mod.plan_micro_batches(batch, list(range(len(batch))), budget))
    # one backbone pass per micro-batch; the shared prompt's is two (prompts, then responses)
    assert (n_micro, n_calls) == ((1, 2) if shared else (n_micro, n_micro))
    assert shared or n_micro > 1
    model.config.final_logit_softcapping = 30.0
    assert forward_mod.batched_log_probs_and_hidden(model, batch, budget) is None
