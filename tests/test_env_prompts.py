"""Prompt templates and chat vs raw prompt building."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from llds.env import DEFAULT_INSTRUCTION, PromptTemplate, build_prompt, build_prompt_ids
from llds.errors import ConfigError, UserInputError

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer(*, chat: bool, adds_bos: bool = True) -> PreTrainedTokenizerFast:
    """A tiny byte-level BPE tokenizer whose post-processor prepends <s> (like Llama's)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "<|user|>", "<|assistant|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["Question: what is the capital of France?", "<think> search"], trainer)
    if adds_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
        )
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>")
    if chat:
        wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


# --- templates ------------------------------------------------------------------------------


def test_default_instruction_describes_the_protocol():
    pieces = ["<think>", "</think>", "<search>", "</search>", "<information>", "</information>"]
    pieces += ["<answer> Paris </answer>", "Question: {question}"]
    for piece in pieces:
        assert piece in DEFAULT_INSTRUCTION
    # reasoning is asked for before searching and answering
    assert DEFAULT_INSTRUCTION.index("<think>") < DEFAULT_INSTRUCTION.index("<search>")
    assert DEFAULT_INSTRUCTION.index("<search>") < DEFAULT_INSTRUCTION.index("<answer>")


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("who wrote Faust", "who wrote Faust?"),
        ("  who wrote Faust  \n", "who wrote Faust?"),
        ("Who wrote Faust?", "Who wrote Faust?"),
        ("Name the author.", "Name the author."),
        ("Name the author!", "Name the author!"),
        ("東京の人口は？", "東京の人口は？"),
        ("qui a écrit Faust", "qui a écrit Faust?"),
    ],
)
def test_render_question_mark(question, expected):
    assert PromptTemplate("Q: {question}|").render(question) == f"Q: {expected}|"


def test_render_default_ends_with_question():
    rendered = PromptTemplate.default().render("what is the capital of France")
    assert rendered == DEFAULT_INSTRUCTION.replace("{question}", "what is the capital of France?")
    assert rendered.rstrip().endswith("Question: what is the capital of France?")


def test_template_other_braces_are_kept():
    template = PromptTemplate('Answer as {"answer": ...}. {question} {question}')
    assert template.render("x") == 'Answer as {"answer": ...}. x? x?'


def test_template_without_field_is_a_config_error():
    with pytest.raises(ConfigError, match=r"\{question\}"):
        PromptTemplate("no field here")


def test_empty_question_is_an_error():
    with pytest.raises(UserInputError, match="empty"):
        PromptTemplate.default().render("   ")


def test_from_file(tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_text("Zürich prompt: {question}\n", encoding="utf-8")
    assert PromptTemplate.from_file(path).render("why") == "Zürich prompt: why?\n"
    missing = tmp_path / "missing.txt"
    with pytest.raises(ConfigError, match=r"missing\.txt"):
        PromptTemplate.from_file(missing)
    bad = tmp_path / "bad.txt"
    bad.write_text("no field", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad\.txt"):
        PromptTemplate.from_file(bad)
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe{question}\xff")
    with pytest.raises(ConfigError, match=r"binary\.txt"):
        PromptTemplate.from_file(binary)


# --- chat vs raw ----------------------------------------------------------------------------


def test_build_prompt_chat_and_raw():
    template = PromptTemplate("Q: {question}")
    chat_tok = make_tokenizer(chat=True)
    expected_chat = "<s><|user|>Q: capital of France?\n<|assistant|>"
    assert build_prompt(chat_tok, "capital of France", template) == expected_chat
    assert build_prompt(chat_tok, "capital of France", template, chat=True) == expected_chat
    assert build_prompt(chat_tok, "capital of France", template, chat=False) == (
        "Q: capital of France?"
    )
    raw_tok = make_tokenizer(chat=False)
    assert build_prompt(raw_tok, "capital of France", "Q: {question}") == "Q: capital of France?"
    with pytest.raises(ConfigError, match="chat_template"):
        build_prompt(raw_tok, "capital of France", template, chat=True)


def test_build_prompt_default_template():
    tok = make_tokenizer(chat=False)
    assert build_prompt(tok, "who wrote Faust") == PromptTemplate.default().render(
        "who wrote Faust"
    )


def test_build_prompt_ids_single_bos_in_chat_mode():
    tok = make_tokenizer(chat=True)
    bos = tok.bos_token_id
    ids = build_prompt_ids(tok, "capital of France", "Q: {question}")
    assert ids[0] == bos and ids.count(bos) == 1
    assert tok.decode(ids) == "<s><|user|>Q: capital of France?\n<|assistant|>"
    # the naive way doubles the BOS: the template writes one and the post-processor adds one
    naive = tok.encode(build_prompt(tok, "capital of France", "Q: {question}"))
    assert naive[:2] == [bos, bos]


def test_build_prompt_ids_raw_mode_adds_usual_special_tokens():
    tok = make_tokenizer(chat=False)
    ids = build_prompt_ids(tok, "capital of France", "Q: {question}")
    assert ids == tok.encode("Q: capital of France?")
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    no_bos = make_tokenizer(chat=False, adds_bos=False)
    ids = build_prompt_ids(no_bos, "capital of France", "Q: {question}")
    assert ids == no_bos.encode("Q: capital of France?", add_special_tokens=False)
    assert no_bos.bos_token_id not in ids


def test_build_prompt_ids_chat_forced_off_on_chat_tokenizer():
    tok = make_tokenizer(chat=True)
    ids = build_prompt_ids(tok, "capital of France", "Q: {question}", chat=False)
    assert tok.decode(ids) == "<s>Q: capital of France?"
