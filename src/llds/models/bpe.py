"""Train a small byte-level BPE tokenizer whose protocol tags are single tokens.

A tiny model learns much faster with an ~8k vocabulary fitted to its corpus than with a 49k
general one (the output head dominates the cost). The result is a base-model tokenizer: no chat
template, prompts are raw text.

Special-token choice: one `<|endoftext|>` token serves as BOS, EOS and PAD (as in GPT-2/Qwen2
base models); padding is masked by attention masks, so sharing it with EOS is harmless. The eight
protocol tags are added as ordinary (non-special) added tokens, so they are never split and
`decode(..., skip_special_tokens=True)` still keeps them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from llds.errors import DataFormatError, UserInputError

EOS_TOKEN = "<|endoftext|>"
PROTOCOL_TAGS = (
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<answer>",
    "</answer>",
    "<information>",
    "</information>",
)


def train_bpe_tokenizer(
    texts: Iterable[str], vocab_size: int = 8000, *, extra_tokens: Sequence[str] = ()
) -> Any:
    """Fit a byte-level BPE on `texts`; `len(tokenizer) <= vocab_size` including added tokens.

    Deterministic: the same texts and arguments give the same vocabulary and merges.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    added = [t for t in dict.fromkeys((*PROTOCOL_TAGS, *extra_tokens)) if t != EOS_TOKEN]
    budget = vocab_size - len(added)
    if budget < 257 + 1:  # 256 byte symbols + the EOS token must fit
        raise UserInputError(
            f"vocab_size {vocab_size} is too small: byte-level BPE needs at "
            f"least {258 + len(added)} entries with these added tokens"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=budget,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in added])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def _world_texts(world_dir: Path) -> Iterator[str]:
    corpus = world_dir / "corpus.jsonl"
    if not corpus.is_file():
        raise UserInputError(f"{world_dir} has no corpus.jsonl (not a world directory?)")
    for name in ("corpus.jsonl", "train.jsonl"):
        path = world_dir / name
        if not path.is_file():
            continue
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataFormatError(f"{path} line {lineno}: invalid JSON") from exc
                if "contents" in row:
                    yield str(row["contents"])
                if "question" in row:
                    yield str(row["question"])
                    yield " ".join(str(a) for a in row.get("golden_answers", ()))


def tokenizer_for_world(
    world: Any,
    vocab_size: int = 8000,
    *,
    extra_texts: Iterable[str] = (),
    extra_tokens: Sequence[str] = (),
) -> Any:
    """BPE fitted to a world: its passages, then its training questions, then `extra_texts`.

    `world` is a world directory, a `World` (from `generate_world` / `read_world`), or the texts
    themselves. `extra_texts` adds text the model will also see (e.g. the prompt instruction);
    `extra_tokens` become single tokens (e.g. entity names). The one place the project fits a
    tokenizer to a world: the warm start, the tests and the benchmarks all call it.
    """
    texts: Iterable[str]
    if isinstance(world, (str, Path)):
        texts = _world_texts(Path(world))
    elif hasattr(world, "corpus") and hasattr(world, "train"):
        texts = [d["contents"] for d in world.corpus] + [q.question for q in world.train]
    else:
        texts = world
    return train_bpe_tokenizer(
        [*texts, *extra_texts], vocab_size + len(extra_tokens), extra_tokens=extra_tokens
    )
