"""The user prompt that explains the search protocol and asks the question."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llds.errors import ConfigError, UserInputError

QUESTION_FIELD = "{question}"

DEFAULT_INSTRUCTION = (
    "Answer the question below. Before anything else, reason step by step inside <think> and "
    "</think>, and reason again whenever new information arrives. If you are missing knowledge "
    "you need, look it up by writing <search> your query </search>; the top results will be "
    "shown to you between <information> and </information>. You may search as often as you "
    "need. When you are ready, write only the short final answer inside <answer> and </answer>, "
    "with no explanation, for example <answer> Paris </answer>.\n"
    "Question: {question}\n"
)

# Endings that already close a question; anything else gets a "?" appended.
_SENTENCE_ENDS = ("?", ".", "!", "？", "。", "！")


def _finish_question(question: str) -> str:
    text = question.strip()
    if not text:
        raise UserInputError("question is empty")
    return text if text.endswith(_SENTENCE_ENDS) else text + "?"


@dataclass(frozen=True)
class PromptTemplate:
    """A prompt with a `{question}` field.

    Only the literal `{question}` is substituted (no str.format), so templates may contain other
    braces, e.g. JSON examples, without escaping.
    """

    text: str

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or QUESTION_FIELD not in self.text:
            raise ConfigError(f"prompt template must contain the field {QUESTION_FIELD}")

    def render(self, question: str) -> str:
        """The prompt for `question`; a "?" is appended unless it already ends with ? . or !"""
        return self.text.replace(QUESTION_FIELD, _finish_question(question))

    @classmethod
    def from_file(cls, path: str | Path) -> PromptTemplate:
        """Read a UTF-8 text file holding the whole template."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"prompt template file not found: {path}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read prompt template file {path}: {exc}") from None
        if QUESTION_FIELD not in text:
            raise ConfigError(f"prompt template file {path} does not contain {QUESTION_FIELD}")
        return cls(text)

    @classmethod
    def default(cls) -> PromptTemplate:
        return cls(DEFAULT_INSTRUCTION)

    @classmethod
    def from_spec(cls, spec: str | None, key: str) -> PromptTemplate:
        """A config's template: inline text with {question}, a file holding one, or None for
        the default; anything else is one `ConfigError` naming `key`. Torch-free, so that a
        command reads it before any model loads."""
        if spec is None:
            return cls.default()
        if QUESTION_FIELD in spec:
            return cls(spec)
        if not Path(spec).is_file():
            raise ConfigError(
                f"{key}: {spec!r} is neither a file nor a template with {QUESTION_FIELD}"
            )
        try:
            return cls.from_file(spec)
        except ConfigError as exc:
            raise ConfigError(f"{key}: {exc}") from None


def _as_template(template: PromptTemplate | str | None) -> PromptTemplate:
    if template is None:
        return PromptTemplate.default()
    return template if isinstance(template, PromptTemplate) else PromptTemplate(template)


def _use_chat(tokenizer: Any, chat: bool | None) -> bool:
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if chat is None:
        return has_template
    if chat and not has_template:
        raise ConfigError("chat=True but the tokenizer has no chat_template; use chat=False")
    return chat


def build_prompt(
    tokenizer: Any,
    question: str,
    template: PromptTemplate | str | None = None,
    *,
    chat: bool | None = None,
) -> str:
    """The prompt text: the rendered template as one user message, or raw.

    `chat=None` uses the tokenizer's chat template when it has one (instruct models) and the raw
    text otherwise (base models without a template).
    """
    rendered = _as_template(template).render(question)
    if not _use_chat(tokenizer, chat):
        return rendered
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": rendered}], tokenize=False, add_generation_prompt=True
    )


def build_prompt_ids(
    tokenizer: Any,
    question: str,
    template: PromptTemplate | str | None = None,
    *,
    chat: bool | None = None,
) -> list[int]:
    """Token ids of `build_prompt`, with special tokens added exactly once.

    A chat template writes its own special tokens (BOS included, when the model uses one), so its
    text is encoded without adding more; raw text gets the tokenizer's usual special tokens.
    If a BOS still ends up doubled at the start, one copy is dropped.
    """
    use_chat = _use_chat(tokenizer, chat)
    text = build_prompt(tokenizer, question, template, chat=use_chat)
    ids = list(tokenizer.encode(text, add_special_tokens=not use_chat))
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None and len(ids) >= 2 and ids[0] == ids[1] == bos:
        ids = ids[1:]
    return ids
