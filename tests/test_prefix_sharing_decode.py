"""Prefix-shared decoding (`StaticDecoder.share_prompts`, `SharedPrefix`): each group's prompt
cached once and attended to once per group, merged with each row's own keys by log-sum-exp.
Checked against transformers' forward of each whole row, and whole rollouts against the
unshared static loop and the eager loop under the same seeds."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import make_tiny_model, rollout_requests, tag_happy
from llds.models.static_decoder import StaticDecoder
from llds.models.tiny import tiny_causal_lm
from llds.rollout import RolloutConfig, RolloutEngine


@pytest.mark.parametrize("compact", [False, True])
def test_shared_prompt_logits_equal_each_whole_rows_forward(compact):
    """Three groups (2, 3 and 1 rows) with prompts of different lengths: the logits after each
    prompt, after a per-row piece prefilled on a subset of rows (as observations are), and at
    every decode step (rows swapped between steps, as finished ones leave the front) equal
    the transformers forward of each row's whole sequence to 1e-5."""
    model = tiny_causal_lm(97, hidden_size=32, num_layers=2, seed=3).eval()
    torch.manual_seed(4)
    prompts = [torch.randint(3, 97, (n,)) for n in (9, 5, 12)]
    row_group = torch.tensor([0, 1, 0, 1, 2, 1])
    tails = [torch.randint(3, 97, (14,)) for _ in row_group]
    seqs = [torch.cat([prompts[int(g)], t]) for g, t in zip(row_group, tails, strict=True)]
    with torch.no_grad():
        want = [model(input_ids=s[None]).logits[0].float() for s in seqs]
        dec = StaticDecoder(model, rows=6, capacity=64)
        ids = torch.zeros(3, 12, dtype=torch.long)
        for u, p in enumerate(prompts):
            ids[u, : len(p)] = p
        lengths = torch.tensor([len(p) for p in prompts])
        got = dec.share_prompts(ids, lengths, row_group.clone())
        for u, p in enumerate(prompts):
            row = int((row_group == u).nonzero()[0])
            assert torch.allclose(got[u], want[row][len(p) - 1], atol=1e-5)
        assert dec.keys[0][:, :, : int(lengths.max())].abs().sum() == 0  # no row holds a prompt
        start = lengths[row_group]
        # rows 0, 3, 4 get 4 tokens, 3 or 2 of their tails in one piece; the others 1
        first = torch.tensor([4, 1, 1, 3, 2, 1])
        for rows in ([0, 3, 4], [1, 2, 5]):
            index = torch.tensor(rows)
            feed = torch.zeros(len(rows), int(first[index].max()), dtype=torch.long)
            for i, r in enumerate(rows):
                feed[i, : first[r]] = tails[r][: first[r]]
            got = dec.prefill(feed, first[index], start[index], index)
            for i, r in enumerate(rows):
                assert torch.allclose(got[i], want[r][start[r] + first[r] - 1], atol=1e-5)
        seq_at = list(range(6))  # the sequence each cache row holds
        done = first.clone()
        for k in range(8):
            if compact and k in (3, 6):  # rows change places, as `_to_front` swaps them
                dec.swap_rows(torch.tensor([0, 4]), torch.tensor([5, 1]), 40)
                seq_at[0], seq_at[5] = seq_at[5], seq_at[0]
                seq_at[4], seq_at[1] = seq_at[1], seq_at[4]
            tokens = torch.stack([tails[s][done[s]] for s in seq_at])
            positions = torch.stack([start[s] + done[s] for s in seq_at])
            got = dec.step(tokens, positions, int(positions.max()) + 1)
            for row, s in enumerate(seq_at):
                assert torch.allclose(got[row], want[s][start[s] + done[s]], atol=1e-5), (k, s)
            done += 1


SHARED = {"prefix_sharing": True, "share_decode_prompts": True}
"""the static loop's decode over one copy of each prompt"""


def _seeded(world, tok, *, n: int, group: int, first: int):
    """`n` requests in groups of `group` with their own seeds `first`, `first + 1`, ..."""
    requests = rollout_requests(world, tok, n=n, group=group)
    return [dataclasses.replace(r, seed=first + i) for i, r in enumerate(requests)]


def _engine(model, tok, retriever, *, cache="static", **cfg):
    base = dict(max_turns=2, max_turn_tokens=24, max_obs_tokens=48, max_total_tokens=320, topk=2)
    base.update(cfg)
    return RolloutEngine(model, tok, retriever, RolloutConfig(cache=cache, **base))


def _same(a, b) -> bool:
    """Token-identical rollouts with the same stops, and sampling log-probs within 1e-5."""
    for x, y in zip(a.episodes, b.episodes, strict=True):
        facts = ("response_ids", "action_mask", "stop_reason", "context_capped", "num_turns")
        if any(getattr(x, f) != getattr(y, f) for f in facts):
            return False
        if max((abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)), default=0) > 1e-5:
            return False
    return True


@pytest.mark.parametrize(
    "settings", [{}, {"max_rows": 5}, {"temperature": 0.0}, {"max_total_tokens": 120}]
)
def test_shared_prompt_rollouts_are_token_identical(
    small_world, world_tokenizer, world_retriever, settings
):
    """Same seeds, same rollouts with the prompts shared and not (static loop), and as the eager
    loop samples them; with finished rows leaving the front (a CPU's default) and staying."""
    tok = world_tokenizer
    model = tag_happy(make_tiny_model(tok, seed=2), tok)
    reqs = _seeded(small_world, tok, n=24, group=4, first=500)
    eager = _engine(model, tok, world_retriever, cache="dynamic", **settings).generate(reqs)
    assert len({e.stop_reason for e in eager.episodes}) >= 2 or settings.get("temperature") == 0
    plain = _engine(model, tok, world_retriever, prefix_sharing=False, **settings)
    assert _same(eager, plain.generate(reqs))
    for compact in (True, False):
        shared = _engine(model, tok, world_retriever, **SHARED, **settings)
        shared.compact = compact
        assert _same(eager, shared.generate(reqs)), compact
    assert shared._decoder is not None and shared._decoder.prefix is not None
    # prefix sharing for the passes alone: the decode keeps a copy of the prompt in every row
    passes_only = _engine(model, tok, world_retriever, prefix_sharing=True, **settings)
    assert _same(eager, passes_only.generate(reqs))
    assert passes_only._decoder is not None and passes_only._decoder.prefix is None


def test_compiled_shared_decode_samples_what_the_eager_loop_samples(
    small_world, world_tokenizer, world_retriever
):
    """`rollout.compile` over shared prompts: the step compiles (its group index is built
    outside the compiled function) and samples the eager loop's tokens."""
    model = tag_happy(make_tiny_model(world_tokenizer, seed=1), world_tokenizer)
    reqs = _seeded(small_world, world_tokenizer, n=6, group=3, first=77)
    tok, settings = world_tokenizer, {"max_turns": 1, "max_turn_tokens": 12}
    eager = _engine(model, tok, world_retriever, cache="dynamic", **settings).generate(reqs)
    compiled = _engine(model, tok, world_retriever, compile=True, **SHARED, **settings)
    assert _same(eager, compiled.generate(reqs))
    assert compiled._decoder is not None and compiled._decoder.prefix is not None
    assert compiled.compile_seconds > 0
