"""Observation text: hit formatting, token-capped information blocks, corrective messages."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from llds.env import (
    PROTOCOL_TOKENS,
    format_hits,
    information_block,
    invalid_action_message,
    truncate_to_tokens,
)
from llds.retrieval.base import Hit

SENTENCES = [
    "Doc 1(Title: Paris) Paris is the capital of France.",
    "Doc 2(Title: Lyon) Lyon is a city in France on the Rhône.",
    "Zürich and Genève are cities in Switzerland.",
]

HITS = [
    Hit("1", '"Paris"\nParis is the capital of France.', 1.0),
    Hit("2", '"Lyon"\nLyon is a city in France on the Rhône.', 0.5),
]


def word_level_tokenizer() -> PreTrainedTokenizerFast:
    """Words and punctuation runs are tokens: counts are easy to do by hand."""
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def byte_bpe_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE: non-ASCII characters can span several tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(SENTENCES, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_format_hits():
    assert format_hits(HITS) == (
        "Doc 1(Title: Paris) Paris is the capital of France.\n"
        "Doc 2(Title: Lyon) Lyon is a city in France on the Rhône."
    )
    assert format_hits([]) == ""
    # a contents string without a quoted title line: the first line is the title, text empty
    assert format_hits([Hit("x", "Only a title")]) == "Doc 1(Title: Only a title) "


def test_information_block_untruncated():
    block = information_block(HITS)
    assert block == "\n\n<information>" + format_hits(HITS) + "</information>\n\n"


def test_information_block_truncated_word_level():
    tok = word_level_tokenizer()
    # tokens: Doc | 1 | ( | Title | : | Paris | ) | Paris ...  -> 5 tokens = "Doc 1(Title:"
    block = information_block(HITS, tokenizer=tok, max_tokens=5)
    assert block == "\n\n<information>Doc 1(Title:</information>\n\n"
    # a cap at or above the length keeps everything
    full = len(tok.encode(format_hits(HITS), add_special_tokens=False))
    assert full == 31  # 14 + 17 tokens counted by hand for the two lines
    assert information_block(HITS, tokenizer=tok, max_tokens=full) == information_block(HITS)
    assert information_block(HITS, tokenizer=tok, max_tokens=0) == (
        "\n\n<information></information>\n\n"
    )


@pytest.mark.parametrize("cap", [1, 2, 3, 7, 13, 20, 40])
def test_truncation_respects_token_cap_with_multibyte_text(cap):
    tok = byte_bpe_tokenizer()
    text = "Zürich und Genève: 東京 🙂 Paris is the capital of France."
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > 20  # the cases below do cut
    cut = truncate_to_tokens(text, tok, cap)
    assert text.startswith(cut)
    assert len(tok.encode(cut, add_special_tokens=False)) <= min(cap, len(ids))
    # little is wasted: at most the pieces of one split character (up to 4 bytes) are dropped
    assert len(tok.encode(cut, add_special_tokens=False)) >= min(cap, len(ids)) - 3


def test_truncation_keeps_as_many_tokens_as_fit_on_ascii():
    tok = byte_bpe_tokenizer()
    text = "Paris is the capital of France. Lyon is a city in France."
    ids = tok.encode(text, add_special_tokens=False)
    for cap in range(1, len(ids)):
        cut = truncate_to_tokens(text, tok, cap)
        # ASCII byte-level BPE cuts exactly at the cap-th token boundary
        assert cut == tok.decode(ids[:cap])
        assert len(tok.encode(cut, add_special_tokens=False)) == cap


def test_max_tokens_without_tokenizer_is_an_error():
    with pytest.raises(ValueError, match="tokenizer"):
        information_block(HITS, max_tokens=3)
    with pytest.raises(ValueError, match="max_tokens"):
        truncate_to_tokens("abc", word_level_tokenizer(), -1)


def test_messages_are_observations_that_teach_the_tags():
    message = invalid_action_message()
    assert message.startswith("\n") and message.endswith("\n")
    assert "<answer>" in message and "</answer>" in message
    assert "<search>" in invalid_action_message() and "</search>" in invalid_action_message()


def test_protocol_tokens_can_be_added_as_single_tokens():
    tok = word_level_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(PROTOCOL_TOKENS)})
    ids = tok.encode("<search>Paris</search>", add_special_tokens=False)
    assert len(ids) == 3
