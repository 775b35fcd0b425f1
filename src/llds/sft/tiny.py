"""`tiny=true`'s model: a fresh tiny Qwen2 and a BPE tokenizer fitted to the world it learns.

A CPU-sized model needs a vocabulary made for its corpus, its prompt and its expert's phrasing;
an off-the-shelf tokenizer would spend most of its embedding on text the model never reads.
"""

from __future__ import annotations

from typing import Any

from llds.sft.config import SFTConfig


def _tokenizer_texts(template: Any, think_bank: Any = "fixed", reading: bool = False) -> list[str]:
    """Text the tiny model will read besides the corpus: the prompt and the expert phrasing."""
    from llds.env.prompts import DEFAULT_INSTRUCTION
    from llds.sft.data import tokenizer_phrases

    prompt = DEFAULT_INSTRUCTION if template is None else template.text
    phrases = tokenizer_phrases(think_bank, reading=reading)
    return [prompt] * 5 + phrases


def tiny_tokenizer(
    corpus: str,
    train: list[Any],
    vocab_size: int,
    *,
    template: Any = None,
    name_tokens: bool = True,
    think_bank: Any = "fixed",
    reading: bool = False,
) -> Any:
    """BPE fitted to the corpus, the training questions, the prompt and the expert phrasing.

    With `name_tokens`, every passage title becomes one added token. In the synthetic world the
    titles are the entity names, so a tiny model copies a name (question -> query, passage ->
    next query or answer) as one token instead of a run of syllable pieces; without this, copying
    is what a CPU-sized model fails to learn in minutes.
    """
    from llds.models.bpe import tokenizer_for_world
    from llds.retrieval.base import Hit
    from llds.retrieval.corpus import read_corpus

    passages = [p.contents for p in read_corpus(corpus)]
    texts = (
        passages + [ex.question for ex in train] + _tokenizer_texts(template, think_bank, reading)
    )
    names: list[str] = []
    if name_tokens:
        titles = (Hit("", text, 0.0).title.strip() for text in passages)
        names = sorted({t for t in titles if t and " " not in t})
    return tokenizer_for_world(texts, vocab_size, extra_tokens=names)


def tiny_model_and_tokenizer(
    cfg: SFTConfig, corpus: str, train: list[Any], template: Any = None
) -> tuple[Any, Any]:
    """`tiny=true`'s fresh model and the BPE tokenizer fitted to `corpus` and the questions, as
    `cfg` sets them (vocabulary, name tokens, think bank, size, seed), on the CPU."""
    from llds.models import tiny_causal_lm_for

    tok = tiny_tokenizer(
        corpus,
        train,
        cfg.tokenizer_vocab,
        template=template,
        name_tokens=cfg.name_tokens,
        think_bank=cfg.think_bank,
        reading=cfg.reading,
    )
    model = tiny_causal_lm_for(
        tok,
        hidden_size=cfg.hidden,
        num_layers=cfg.layers,
        num_heads=cfg.heads,
        num_kv_heads=max(1, cfg.heads // 2),
        seed=cfg.seed,
    )
    return model, tok
