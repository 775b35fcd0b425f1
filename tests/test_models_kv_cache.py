"""Passing the key/value cache under the name the model takes (`cache` on new transformers,
`past_key_values` on old), through wrappers, and reading it back from the output; the rollout
engine and the shared-prompt pass then run without the rename's deprecation warning."""

from __future__ import annotations

import dataclasses
import inspect
import warnings

import torch
from torch import nn

from conftest import make_tiny_model, tag_happy
from llds.models.kv_cache import NEW_NAME, OLD_NAME, cache_argument, returned_cache


class _OldStyle(nn.Module):
    def forward(self, input_ids=None, past_key_values=None, use_cache=None):
        return past_key_values


class _NewStyle(nn.Module):
    def forward(self, input_ids=None, cache=None, use_cache=None):
        return cache


class _PassThrough(nn.Module):
    """Like a PEFT model or DDP: a forward that takes anything and hands it to `inner`."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)


def test_the_name_follows_the_forward_signature() -> None:
    assert cache_argument(_OldStyle()) == OLD_NAME
    assert cache_argument(_NewStyle()) == NEW_NAME
    # a `**kwargs` forward that is not a transformers model gives no name: the old one
    assert cache_argument(_PassThrough(_NewStyle())) == OLD_NAME


def test_a_wrapper_asks_the_transformers_model_inside(world_tokenizer) -> None:
    model = make_tiny_model(world_tokenizer, seed=0)
    declared = inspect.signature(type(model).forward).parameters
    expected = NEW_NAME if NEW_NAME in declared else OLD_NAME
    assert cache_argument(model) == expected
    assert cache_argument(_PassThrough(model)) == expected


@dataclasses.dataclass
class _OldOutput:
    logits: object = None
    past_key_values: object = None


@dataclasses.dataclass
class _NewOutput:
    logits: object = None
    cache: object = None


def test_the_cache_is_read_under_the_declared_field() -> None:
    marker = object()
    assert returned_cache(_OldOutput(past_key_values=marker)) is marker
    assert returned_cache(_NewOutput(cache=marker)) is marker


def test_a_cache_fed_back_under_the_chosen_name_continues_the_sequence(world_tokenizer) -> None:
    """Prefix, then the rest with the prefix's cache, equals one pass over the whole sequence:
    a cache passed under a name the model ignored would restart at position 0."""
    model = make_tiny_model(world_tokenizer, seed=1).eval()
    wrapped = _PassThrough(model)
    ids = torch.randint(5, len(world_tokenizer), (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        full = model(input_ids=ids).logits[:, 5:]
        head = wrapped(input_ids=ids[:, :5], use_cache=True)
        tail = wrapped(
            input_ids=ids[:, 5:],
            position_ids=torch.arange(5, 9).expand(2, -1),
            use_cache=True,
            **{cache_argument(wrapped): returned_cache(head)},
        )
    assert torch.allclose(tail.logits, full, atol=1e-5)


def test_rollout_and_log_probs_raise_no_rename_warning(
    small_world, world_tokenizer, world_retriever
) -> None:
    """Fails on code that passes `past_key_values` to a transformers release that renamed it."""
    from llds.env.prompts import build_prompt_ids
    from llds.policy.forward import response_log_probs
    from llds.rollout import RolloutConfig, RolloutEngine, RolloutRequest

    model = tag_happy(make_tiny_model(world_tokenizer, seed=2), world_tokenizer)
    config = RolloutConfig(max_turns=2, max_turn_tokens=16, max_obs_tokens=32, topk=2)
    engine = RolloutEngine(model, world_tokenizer, world_retriever, config)
    requests = [
        RolloutRequest(
            build_prompt_ids(world_tokenizer, q.question, "Question: {question}\n"),
            q.id,
            f"{q.id}#0",
            q.answers,
        )
        for q in small_world.train[:2]
        for _ in range(2)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        batch = engine.generate(requests, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            logp, _ = response_log_probs(model, batch)
    assert engine.stats["forward_calls"] > 1  # decoding went through the cache path
    assert logp.shape == batch.loss_mask.shape
