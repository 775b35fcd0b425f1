"""Tiny random models and the BPE tokenizer: shapes, gradients, determinism, protocol tags."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llds.data.world import WorldConfig, generate_world, write_world
from llds.errors import UserInputError
from llds.models import (
    EOS_TOKEN,
    PROTOCOL_TAGS,
    tiny_causal_lm,
    tiny_causal_lm_for,
    tokenizer_for_world,
    train_bpe_tokenizer,
)

TRAJECTORY = (
    "Question: What is the capital of Pafon?\n"
    "<think> I need the capital of Pafon. </think><search> capital of Pafon </search>\n\n"
    '<information>Doc 1(Title: "Pafon") The capital of Pafon is Glamsho.</information>\n\n'
    "<think> The capital is Glamsho. </think><answer> Glamsho </answer>"
)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    world = generate_world(
        WorldConfig.preset("organism", num_entities=80, num_train=40, num_test=10)
    )
    return [d["contents"] for d in world.corpus] + [ex.question for ex in world.train]


@pytest.fixture(scope="module")
def tokenizer(texts):
    return train_bpe_tokenizer(texts, vocab_size=600)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_forward_backward_shapes(arch: str) -> None:
    model = tiny_causal_lm(97, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, arch=arch)
    ids = torch.randint(0, 97, (2, 7))
    out = model(input_ids=ids, labels=ids)
    assert out.logits.shape == (2, 7, 97)
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_seed_determinism_and_global_rng_untouched() -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = tiny_causal_lm(50, hidden_size=32, num_heads=4, seed=5)
    assert torch.equal(torch.rand(3), expected_next)
    b = tiny_causal_lm(50, hidden_size=32, num_heads=4, seed=5)
    c = tiny_causal_lm(50, hidden_size=32, num_heads=4, seed=6)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)


def test_bad_head_layout_is_refused() -> None:
    with pytest.raises(UserInputError, match="num_heads"):
        tiny_causal_lm(50, hidden_size=30, num_heads=4)
    with pytest.raises(UserInputError, match="arch"):
        tiny_causal_lm(50, arch="gpt9")


def test_trajectory_round_trip_and_single_token_tags(tokenizer) -> None:
    ids = tokenizer(TRAJECTORY)["input_ids"]
    assert tokenizer.decode(ids) == TRAJECTORY
    assert tokenizer.decode(ids, skip_special_tokens=True) == TRAJECTORY  # tags are not special
    tag_ids = []
    for tag in PROTOCOL_TAGS:
        tag_id = tokenizer(tag)["input_ids"]
        assert len(tag_id) == 1
        tag_ids.append(tag_id[0])
        assert tag_id[0] in ids
    assert len(set(tag_ids)) == len(PROTOCOL_TAGS)
    # glued to neighbours, a tag is still its own token
    assert tokenizer("x</search>y")["input_ids"][1] == tokenizer("</search>")["input_ids"][0]


def test_special_tokens_and_base_model_shape(tokenizer) -> None:
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == tokenizer.bos_token_id == eos
    assert tokenizer.decode([*tokenizer("hi")["input_ids"], eos], skip_special_tokens=True) == "hi"
    assert tokenizer.chat_template is None
    assert tokenizer.padding_side == "left"
    assert len(tokenizer) <= 600
    model = tiny_causal_lm_for(tokenizer, hidden_size=32, num_heads=4)
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.eos_token_id == eos


def test_bpe_is_deterministic(texts, tokenizer) -> None:
    again = train_bpe_tokenizer(texts, vocab_size=600)
    assert again.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()
    other = train_bpe_tokenizer(texts[::-1][:50], vocab_size=600)
    assert other.backend_tokenizer.to_str() != tokenizer.backend_tokenizer.to_str()


def test_vocab_too_small_is_refused(texts) -> None:
    with pytest.raises(UserInputError, match="too small"):
        train_bpe_tokenizer(texts, vocab_size=100)


def test_tokenizer_for_world_dir(tmp_path: Path) -> None:
    world = generate_world(
        WorldConfig.preset("organism", num_entities=60, num_train=20, num_test=5)
    )
    write_world(world, tmp_path)
    tok = tokenizer_for_world(tmp_path, vocab_size=500)
    name = world.entities[0].name
    assert tok.decode(tok(f"<search> capital of {name} </search>")["input_ids"]) == (
        f"<search> capital of {name} </search>"
    )
    with pytest.raises(UserInputError, match=r"no corpus\.jsonl"):
        tokenizer_for_world(tmp_path / "nowhere", vocab_size=500)
