"""The static-cache decode loop against the eager one and against transformers' forward."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import make_tiny_model, rollout_requests, tag_happy
from llds.errors import ConfigError
from llds.models.static_decoder import StaticDecoder, static_decode_unsupported
from llds.rollout import RolloutConfig, RolloutEngine


def _tiny(arch: str, vocab: int = 300):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from llds.models.tiny import tiny_causal_lm

    if arch != "qwen3":
        return tiny_causal_lm(
            vocab, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, arch=arch
        )
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    )
    return Qwen3ForCausalLM(config)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_static_decoder_logits_equal_the_transformers_forward(arch):
    """Rows of different lengths, prefilled in two pieces (the second on a subset of rows, as
    an observation is) and then decoded token by token: every logit row equals the full
    forward's at that position to 1e-5."""
    model = _tiny(arch).eval()
    torch.manual_seed(1)
    lengths = [9, 14, 6]
    seqs = [torch.randint(0, 300, (n + 8,)) for n in lengths]
    with torch.no_grad():
        want = [model(input_ids=s[None]).logits[0].float() for s in seqs]
        dec = StaticDecoder(model, rows=3, capacity=64)
        first = [4, 7, 3]
        ids = torch.zeros(3, 7, dtype=torch.long)
        for r, n in enumerate(first):
            ids[r, :n] = seqs[r][:n]
        got = dec.prefill(
            ids, torch.tensor(first), torch.zeros(3, dtype=torch.long), torch.arange(3)
        )
        for r, n in enumerate(first):
            assert torch.allclose(got[r], want[r][n - 1], atol=1e-5)
        # the rest of rows 0 and 2 as one piece (row 1 waits), then row 1's
        for rows in ([0, 2], [1]):
            rest = [lengths[r] - first[r] for r in rows]
            ids = torch.zeros(len(rows), max(rest), dtype=torch.long)
            for i, r in enumerate(rows):
                ids[i, : rest[i]] = seqs[r][first[r] : lengths[r]]
            got = dec.prefill(
                ids, torch.tensor(rest), torch.tensor([first[r] for r in rows]), torch.tensor(rows)
            )
            for i, r in enumerate(rows):
                assert torch.allclose(got[i], want[r][lengths[r] - 1], atol=1e-5)
        for k in range(8):
            tokens = torch.stack([seqs[r][lengths[r] + k] for r in range(3)])
            positions = torch.tensor([n + k for n in lengths])
            got = dec.step(tokens, positions, int(positions.max()) + 1)
            for r in range(3):
                assert torch.allclose(got[r], want[r][lengths[r] + k], atol=1e-5)


def _engine(model, tok, retriever, cache, *, check_every=None, compact=None, **cfg):
    base = dict(max_turns=2, max_turn_tokens=24, max_obs_tokens=48, max_total_tokens=320, topk=2)
    base.update(cfg)
    engine = RolloutEngine(model, tok, retriever, RolloutConfig(cache=cache, **base))
    if check_every is not None:
        engine.check_every = check_every
    if compact is not None:
        engine.compact = compact
    return engine


def _same(a, b) -> bool:
    for x, y in zip(a.episodes, b.episodes, strict=True):
        if (x.response_ids, x.action_mask, x.stop_reason, x.context_capped, x.num_turns) != (
            y.response_ids,
            y.action_mask,
            y.stop_reason,
            y.context_capped,
            y.num_turns,
        ):
            return False
        if max((abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)), default=0) > 1e-5:
            return False
    return True


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"temperature": 0.0},
        {"top_p": 0.8, "top_k": 20},
        {"min_turn_tokens": 10},
        {"max_total_tokens": 120},
        {"max_rows": 5},
    ],
)
def test_static_loop_samples_what_the_eager_loop_samples(
    small_world, world_tokenizer, world_retriever, settings
):
    """Same seeds, same rollouts: token for token, the same stops, caps and masks, and the
    same sampling log-probs; also when the host looks only every 7 or 16 tokens (rows then
    decode past a stop tag and are rolled back) and when finished rows stay in the cache."""
    tok = world_tokenizer
    model = tag_happy(make_tiny_model(tok, seed=1), tok)
    reqs = [
        dataclasses.replace(r, seed=1000 + i)
        for i, r in enumerate(rollout_requests(small_world, tok, n=24))
    ]
    eager = _engine(model, tok, world_retriever, "dynamic", **settings).generate(reqs)
    reasons = {e.stop_reason for e in eager.episodes}
    assert len(reasons) >= 2 or settings.get("temperature") == 0.0  # the branches are exercised
    for every, compact in ((1, True), (7, True), (16, False)):
        engine = _engine(
            model, tok, world_retriever, "static", check_every=every, compact=compact, **settings
        )
        assert engine.cache == "static"
        assert _same(eager, engine.generate(reqs)), (every, compact)


def test_unseeded_requests_draw_their_seeds_from_the_generator(
    small_world, world_tokenizer, world_retriever
):
    tok = world_tokenizer
    model = tag_happy(make_tiny_model(tok, seed=1), tok)
    reqs = rollout_requests(small_world, tok, n=12)
    runs = {}
    for cache in ("dynamic", "static"):
        engine = _engine(model, tok, world_retriever, cache)
        runs[cache] = engine.generate(reqs, generator=torch.Generator().manual_seed(5))
    assert _same(runs["dynamic"], runs["static"])
    engine = _engine(model, tok, world_retriever, "static")
    other = engine.generate(reqs, generator=torch.Generator().manual_seed(6))
    assert not _same(runs["static"], other)


def test_auto_takes_static_where_it_serves_and_static_names_why_not(world_tokenizer):
    tok = world_tokenizer
    model = make_tiny_model(tok)
    cfg = RolloutConfig(max_turns=0)
    assert RolloutEngine(model, tok, None, cfg).cache == "static"
    assert RolloutEngine(model, tok, None, dataclasses.replace(cfg, kv_reuse=False)).cache == (
        "dynamic"
    )

    class Wrapper(torch.nn.Module):  # its own forward could change the logits
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

    wrapped = Wrapper(model)
    assert "wraps" in static_decode_unsupported(wrapped)
    assert RolloutEngine(wrapped, tok, None, cfg).cache == "dynamic"
    with pytest.raises(ConfigError, match=r"rollout\.cache=static.*wraps"):
        RolloutEngine(wrapped, tok, None, dataclasses.replace(cfg, cache="static"))
    # an attention kernel is the eager loop's setting: auto takes that loop, static refuses it
    kernel = RolloutConfig(max_turns=0, dtype="bfloat16", attn_implementation="eager")
    assert RolloutEngine(model, tok, None, kernel).cache == "dynamic"
    with pytest.raises(ValueError, match="attn_implementation"):
        RolloutConfig(cache="static", dtype="bfloat16", attn_implementation="eager")
    split = make_tiny_model(tok)
    split.hf_device_map = {"model.layers.0": 0, "model.layers.1": "cpu"}
    assert "split over devices" in static_decode_unsupported(split)
    gpt2 = _gpt2(len(tok))
    assert "model_type 'gpt2'" in static_decode_unsupported(gpt2)


def _gpt2(vocab: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=32, n_layer=1, n_head=2))


def test_compiled_step_samples_what_the_eager_loop_samples(
    small_world, world_tokenizer, world_retriever
):
    tok = world_tokenizer
    model = tag_happy(make_tiny_model(tok, seed=1), tok)
    reqs = [
        dataclasses.replace(r, seed=77 + i)
        for i, r in enumerate(rollout_requests(small_world, tok, n=6))
    ]
    settings = {"max_turns": 1, "max_turn_tokens": 12}
    eager = _engine(model, tok, world_retriever, "dynamic", **settings).generate(reqs)
    compiled = _engine(model, tok, world_retriever, "static", compile=True, **settings)
    assert _same(eager, compiled.generate(reqs))
    # the compilation's one-time cost is measured (the trainer logs it as time/rollout_compile)
    first = compiled.compile_seconds
    assert first > 0
    assert _engine(model, tok, world_retriever, "static", **settings).compile_seconds == 0
    with pytest.raises(ValueError, match="compile"):
        RolloutConfig(cache="dynamic", compile=True)


def test_greedy_rollouts_are_token_identical_on_the_demo_worlds_held_out_questions():
    """The organism world the demo builds, its held-out questions, greedy decoding as the
    held-out evaluation runs it: both loops write the same tokens."""
    from llds.data.world import WorldConfig, generate_world
    from llds.env.prompts import build_prompt_ids
    from llds.models.bpe import tokenizer_for_world
    from llds.retrieval.factory import build_retriever
    from llds.rollout import RolloutRequest

    world = generate_world(WorldConfig.preset("organism"))
    tok = tokenizer_for_world(world, 700)
    model = tag_happy(make_tiny_model(tok, seed=4, hidden=128), tok)
    retriever = build_retriever(world.corpus, show_progress=False)
    reqs = [
        RolloutRequest(
            build_prompt_ids(tok, q.question, "Question: {question}\n"), q.id, q.id, q.answers
        )
        for q in world.test[:40]
    ]
    settings = dict(max_turns=3, max_turn_tokens=48, max_obs_tokens=120, max_total_tokens=768)
    eager = _engine(model, tok, retriever, "dynamic", temperature=0.0, **settings)
    static = _engine(model, tok, retriever, "static", temperature=0.0, **settings)
    a, b = eager.generate(reqs), static.generate(reqs)
    assert sum(e.num_turns for e in a.episodes) > len(reqs)  # multi-turn rollouts
    assert _same(a, b)


def test_lld_metrics_of_a_short_run_agree_between_the_loops(
    tmp_path, small_world, world_tokenizer, world_retriever
):
    """Three training steps with each loop from the same weights and seeds: the rollouts, the
    update and the LLD diagnostics agree to float rounding."""
    from conftest import TRAIN_BASE
    from llds.train.config import load_config
    from llds.train.trainer import GRPOTrainer

    rows = {}
    for cache in ("dynamic", "static"):
        cfg = load_config(
            None, [*TRAIN_BASE, f"run_dir={tmp_path / cache}", "steps=3", f"rollout.cache={cache}"]
        )
        trainer = GRPOTrainer(
            cfg,
            model=tag_happy(make_tiny_model(world_tokenizer, seed=2), world_tokenizer),
            tokenizer=world_tokenizer,
            retriever=world_retriever,
            train_examples=small_world.train,
            resume=False,
        )
        rows[cache] = trainer.train()
    for a, b in zip(rows["dynamic"], rows["static"], strict=True):
        assert a["rollout/response_tokens"] == b["rollout/response_tokens"]
        assert a["reward/mean"] == b["reward/mean"]
        lld_keys = sorted(k for k in a if k.startswith("lld/"))
        assert len(lld_keys) >= 4 and lld_keys == sorted(k for k in b if k.startswith("lld/"))
        for key in lld_keys:  # nan where a group has no correct response, in both
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5, nan_ok=True), key


def test_one_decoder_serves_every_chunk_and_call(small_world, world_tokenizer, world_retriever):
    """Chunks of 4 and 2 rows, twice over: one decoder (one cache, the same memory) serves them
    all, and every rollout is still the eager loop's, token for token. A compiled step's CUDA
    graphs record the cache's addresses, so a cache made per chunk would re-record them."""
    tok = world_tokenizer
    model = tag_happy(make_tiny_model(tok, seed=3), tok)
    reqs = [
        dataclasses.replace(r, seed=5 + i)
        for i, r in enumerate(rollout_requests(small_world, tok, n=6))
    ]
    eager = _engine(model, tok, world_retriever, "dynamic", max_rows=4).generate(reqs)
    engine = _engine(model, tok, world_retriever, "static", max_rows=4)
    assert _same(eager, engine.generate(reqs))
    decoder = engine._decoder
    assert decoder is not None and decoder.rows == 4
    addresses = [t.data_ptr() for t in (*decoder.keys, *decoder.values)]
    assert _same(eager, engine.generate(reqs))
    assert engine._decoder is decoder
    assert [t.data_ptr() for t in (*decoder.keys, *decoder.values)] == addresses


def test_compile_auto_is_off_on_a_cpu_and_asked_for_is_on(world_tokenizer, world_retriever):
    tok = world_tokenizer
    model = make_tiny_model(tok, seed=1)
    assert RolloutConfig().compile == "auto"
    assert _engine(model, tok, world_retriever, "auto").compile is False
    assert _engine(model, tok, world_retriever, "auto", compile=True).compile is True
    # auto beside the eager loop is no contradiction: nothing to compile there
    assert _engine(model, tok, world_retriever, "dynamic", compile="auto").compile is False
