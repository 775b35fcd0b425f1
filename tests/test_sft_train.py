"""SFT loop: the masked loss against an independent computation, learning, determinism, outputs."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from llds.data.world import WorldConfig, generate_world
from llds.errors import ConfigError
from llds.models import load_policy, tiny_causal_lm_for, train_bpe_tokenizer
from llds.policy.forward import pack_by_length
from llds.retrieval.bm25 import BM25Retriever
from llds.sft.data import EXPERT_PHRASES, ExpertEpisode, build_expert_episodes
from llds.sft.trainer import (
    _pad_batch,
    batch_order,
    masked_token_loss_sum,
    sft_train,
)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: one thread is faster, and far faster on a busy shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def setup():
    world = generate_world(
        WorldConfig.preset(
            "organism", num_entities=40, num_train=20, num_test=4, hop_mix={1: 0.6, 2: 0.4}
        )
    )
    texts = [d["contents"] for d in world.corpus] + [ex.question for ex in world.train]
    tok = train_bpe_tokenizer([*texts, *EXPERT_PHRASES], vocab_size=500)
    retriever = BM25Retriever.build(world.corpus, show_progress=False)
    episodes, _ = build_expert_episodes(world.train, retriever, tok)
    return tok, episodes


def _model(tok, seed=0):
    return tiny_causal_lm_for(tok, hidden_size=64, num_layers=2, seed=seed)


def _reference_loss(model, episodes) -> float:
    """Full-vocabulary logits at every position, HF-style labels with -100 off the mask."""
    total, count = 0.0, 0
    for ep in episodes:
        ids = torch.tensor([ep.input_ids])
        labels = torch.tensor(
            [[t if m else -100 for t, m in zip(ep.input_ids, ep.loss_mask, strict=True)]]
        )
        logits = model(input_ids=ids).logits[0, :-1]
        total += float(F.cross_entropy(logits, labels[0, 1:], reduction="sum", ignore_index=-100))
        count += int((labels[0, 1:] != -100).sum())
    return total / count


def test_masked_loss_matches_reference_with_right_padding(setup) -> None:
    tok, episodes = setup
    model = _model(tok).eval()
    batch = episodes[:4]
    ids, attn, mask = _pad_batch(batch, tok.pad_token_id)
    assert len({len(e) for e in batch}) > 1  # padding really happens
    with torch.no_grad():
        loss_sum, count = masked_token_loss_sum(model, ids, attn, mask)
        ref = _reference_loss(model, batch)
    assert count == sum(sum(e.loss_mask) for e in batch)
    assert float(loss_sum) / count == pytest.approx(ref, rel=1e-5)


def test_loss_on_all_is_plain_language_modelling_of_every_token(setup) -> None:
    """`loss_on="all"`: the first step's loss is the full-sequence next-token cross-entropy of the
    initial model (HF `labels=input_ids`), averaged over every predicted token of the batch."""
    tok, episodes = setup
    batch = episodes[:4]
    model = _model(tok).eval()
    with torch.no_grad():
        total = sum(
            float(
                model(
                    input_ids=torch.tensor([e.input_ids]), labels=torch.tensor([e.input_ids])
                ).loss
            )
            * (len(e) - 1)
            for e in batch
        )
    ref = total / sum(len(e) - 1 for e in batch)
    res = sft_train(
        _model(tok),
        tok,
        batch,
        lr=1e-3,
        steps=1,
        batch_size=4,
        warmup=0,
        micro_batch_tokens=300,
        progress=False,
        loss_on="all",
    )
    assert res.tokens == [sum(len(e) - 1 for e in batch)]
    assert res.losses[0] == pytest.approx(ref, rel=1e-5)
    actions_only = sft_train(
        _model(tok), tok, batch, lr=1e-3, steps=1, batch_size=4, warmup=0, progress=False
    )
    assert actions_only.tokens[0] < res.tokens[0]
    with pytest.raises(ConfigError, match="loss_on"):
        sft_train(_model(tok), tok, batch, steps=1, progress=False, loss_on="observations")


def test_observation_labels_get_no_loss(setup) -> None:
    """A trajectory cut right after its first observation ends on an observation token:
    changing that token changes nothing trained, changing the last action token does."""
    tok, episodes = setup
    model = _model(tok).eval()
    ep = episodes[0]
    cut = ep.loss_mask.index(1)
    while ep.loss_mask[cut]:
        cut += 1
    action_end = cut - 1
    while cut < len(ep) and not ep.loss_mask[cut]:
        cut += 1
    ids = torch.tensor([ep.input_ids[:cut]])
    mask = torch.tensor([ep.loss_mask[:cut]], dtype=torch.bool)
    attn = torch.ones_like(ids)
    other = (ids[0, -1].item() + 1) % len(tok)
    with torch.no_grad():
        base, _ = masked_token_loss_sum(model, ids, attn, mask)
        obs_changed = ids.clone()
        obs_changed[0, -1] = other
        same, _ = masked_token_loss_sum(model, obs_changed, attn, mask)
        act_changed = ids.clone()
        act_changed[0, action_end] = (act_changed[0, action_end].item() + 1) % len(tok)
        diff, _ = masked_token_loss_sum(model, act_changed, attn, mask)
    assert float(same) == float(base)
    assert abs(float(diff) - float(base)) > 1e-4


def test_micro_batches_do_not_change_the_step(setup) -> None:
    tok, episodes = setup
    runs = []
    for budget in (100_000, 1):  # one forward per batch vs one row per forward
        model = _model(tok)
        res = sft_train(
            model,
            tok,
            episodes[:8],
            lr=1e-3,
            steps=2,
            batch_size=4,
            micro_batch_tokens=budget,
            warmup=0,
            progress=False,
        )
        runs.append(res.losses)
    assert runs[0] == pytest.approx(runs[1], rel=1e-4)


@pytest.mark.slow
def test_loss_drops_and_is_deterministic(setup) -> None:
    tok, episodes = setup
    assert len(episodes) == 20
    a = sft_train(
        _model(tok),
        tok,
        episodes,
        lr=1e-2,
        steps=30,
        batch_size=8,
        warmup=3,
        seed=0,
        progress=False,
    )
    assert a.final_loss < 0.5 * a.initial_loss
    b = sft_train(
        _model(tok),
        tok,
        episodes,
        lr=1e-2,
        steps=30,
        batch_size=8,
        warmup=3,
        seed=0,
        progress=False,
    )
    assert a.losses == b.losses
    c = sft_train(
        _model(tok), tok, episodes, lr=3e-3, steps=3, batch_size=8, warmup=3, seed=1, progress=False
    )
    assert c.losses != a.losses[:3]


def test_outputs_written_and_model_loadable(setup, tmp_path) -> None:
    tok, episodes = setup
    model = _model(tok)
    res = sft_train(
        model,
        tok,
        episodes[:6],
        lr=1e-3,
        steps=4,
        batch_size=3,
        warmup=1,
        out_dir=tmp_path,
        progress=False,
    )
    rows = [
        json.loads(line)
        for line in (tmp_path / "sft_metrics.jsonl").read_text().split("\n")
        if line
    ]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["loss"] for r in rows] == res.losses
    assert all(r["tokens"] > 0 and r["lr"] > 0 for r in rows)
    assert (tmp_path / "sft_loss.png").read_bytes()[:4] == b"\x89PNG"
    loaded, loaded_tok = load_policy(tmp_path / "model")
    ids = torch.tensor([episodes[0].input_ids])
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5)
    assert loaded_tok.encode("<search>", add_special_tokens=False) == tok.encode(
        "<search>", add_special_tokens=False
    )
    assert not list(tmp_path.glob(".model*"))  # no temporary folders left behind


def test_batch_order_by_hand() -> None:
    order = batch_order(5, 2, 6, seed=3)
    assert [len(b) for b in order] == [2, 2, 1, 2, 2, 1]
    assert sorted(i for b in order[:3] for i in b) == list(range(5))
    assert sorted(i for b in order[3:] for i in b) == list(range(5))
    assert order == batch_order(5, 2, 6, seed=3) != batch_order(5, 2, 6, seed=4)
    rows = range(3)
    assert pack_by_length([10, 30, 20], rows, 40) == [[1], [2, 0]]
    assert pack_by_length([10, 30, 20], rows, 20) == [[1], [2], [0]]
    assert pack_by_length([10, 30, 20], rows, 60) == [[1, 2], [0]]


def test_bad_arguments_are_named(setup) -> None:
    tok, episodes = setup
    with pytest.raises(ConfigError, match="no training trajectories"):
        sft_train(_model(tok), tok, [], lr=1e-3, steps=1)
    with pytest.raises(ConfigError, match="exactly one of steps or epochs"):
        sft_train(_model(tok), tok, episodes, lr=1e-3, steps=1, epochs=1.0)
    with pytest.raises(ConfigError, match=r"sft\.lr"):
        sft_train(_model(tok), tok, episodes, lr=0.0, steps=1)


def test_epochs_count_steps(setup) -> None:
    tok, episodes = setup
    ep = ExpertEpisode(
        "x",
        episodes[0].input_ids,
        episodes[0].loss_mask,
        episodes[0].prompt_len,
        1,
        (),
        (),
        (),
        "a",
    )
    res = sft_train(
        _model(tok), tok, [ep] * 5, lr=1e-3, epochs=2, batch_size=2, warmup=0, progress=False
    )
    assert res.steps == 6 and len(res.losses) == 6
