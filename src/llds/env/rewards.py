"""Outcome rewards and QA metrics for search rollouts.

`response_text` everywhere is the rollout after the prompt: the model's turns plus the
observations the environment inserted. Scoring never looks at the prompt, so the example answer
inside the instruction can never be scored.

Two ways in: a multi-turn rollout whose turns are known scores its final answer action only
(`final_answer` + `score_answer`, what the rollout engine does), so an `<answer>` opened in one
turn and closed in a later one is no answer. `compute_reward` scores a plain response text whose
turn boundaries are unknown, taking the last complete answer span of the model's text.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field, Strict

from llds.config.schema import section
from llds.env.actions import parse_action
from llds.env.observation import invalid_action_message
from llds.env.tags import ANSWER_CLOSE, ANSWER_OPEN, INFO_CLOSE, INFO_OPEN
from llds.errors import ConfigError, UserInputError

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCT = frozenset(string.punctuation)
_INFO_BLOCK = re.compile(re.escape(INFO_OPEN) + r"(.*?)" + re.escape(INFO_CLOSE), re.DOTALL)
_ANY_TAG = re.compile(r"<(/?)(think|search|answer|information)>")
_VALID_ORDER = re.compile(r"T(SIT)*A")
_LETTER = {"think": "T", "search": "S", "information": "I", "answer": "A"}
_BINARY_METRICS = ("em", "sub_em")
METRICS = ("em", "f1", "sub_em")


def _is_punct(ch: str) -> bool:
    return ch in _ASCII_PUNCT or unicodedata.category(ch).startswith("P")


def normalize_answer(s: str) -> str:
    """SQuAD normalization, Unicode-aware.

    Lowercase, drop punctuation, drop the whole words a/an/the, collapse whitespace; as in SQuAD
    (and Search-R1) punctuation is deleted, not replaced by a space ("U.S." -> "us"). Beyond
    ASCII: NFKC + casefold first (full-width letters, ligatures and "ß" compare as their plain
    forms), and every Unicode punctuation character is dropped, not only ASCII's. Accents are
    kept: "café" and "cafe" differ.
    """
    text = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", s).casefold())
    text = "".join(ch for ch in text if not _is_punct(ch))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _model_text(response_text: str) -> str:
    """The response with the environment's text (information blocks, messages) blanked out."""
    text = _INFO_BLOCK.sub("\n", response_text)
    text = text.replace(invalid_action_message().strip(), "\n")
    return text


def extract_answer(response_text: str) -> str | None:
    """Stripped content of the last complete `<answer>...</answer>` the model wrote, else None.

    A span runs from an `<answer>` to the next `</answer>`; with repeated opening tags the
    nearest one counts, and a closing tag with no opening tag since the previous span is skipped.
    Information blocks and the environment's messages are skipped (they are not the model's).
    An empty span gives "" (an answer was given; it matches nothing).
    """
    text = _model_text(response_text)
    close_at = text.rfind(ANSWER_CLOSE)
    while close_at >= 0:
        previous_close = text.rfind(ANSWER_CLOSE, 0, close_at)
        open_at = text.rfind(ANSWER_OPEN, 0, close_at)
        if open_at > previous_close:  # an opening tag after the previous span: complete
            return text[open_at + len(ANSWER_OPEN) : close_at].strip()
        close_at = previous_close
    return None


def final_answer(turn_texts: Sequence[str]) -> str | None:
    """The answer of a multi-turn rollout: the content of the answer action of its LAST turn.

    `turn_texts` are the model's turns in order (observations excluded). The last turn is parsed
    as the environment parses it (`parse_action`: the complete span whose closing tag comes first
    decides); when that action is an answer its stripped content is returned ("" for an empty
    answer), otherwise None. Earlier turns are never read: an `<answer>` opened in one turn and
    closed in a later turn, across an observation, is no answer.
    """
    if not turn_texts:
        return None
    action = parse_action(turn_texts[-1])
    return action.content if action.kind == "answer" else None


def _gold_list(golds: Sequence[str] | str) -> list[str]:
    """Accept one gold string as well as a list (iterating a str would give characters)."""
    gold_list = [golds] if isinstance(golds, str) else list(golds)
    if not gold_list:
        raise UserInputError("no gold answers given: an example needs at least one answer")
    return gold_list


def exact_match(pred: str | None, golds: Sequence[str] | str) -> float:
    """1.0 when the normalized prediction equals any normalized gold, else 0.0.

    A missing or empty (after normalization) prediction never matches.
    """
    gold_list = _gold_list(golds)
    if pred is None:
        return 0.0
    p = normalize_answer(pred)
    return float(bool(p) and any(p == normalize_answer(g) for g in gold_list))


def substring_match(pred: str | None, golds: Sequence[str] | str) -> float:
    """1.0 when some normalized gold occurs in the normalized prediction (character substring).

    Golds that normalize to "" are skipped (they would match everything).
    """
    gold_list = _gold_list(golds)
    if pred is None:
        return 0.0
    p = normalize_answer(pred)
    return float(any((g := normalize_answer(gold)) and g in p for gold in gold_list))


_SPECIAL_ANSWERS = ("yes", "no", "noanswer")


def _f1_one(pred: str, gold: str) -> float:
    p, g = normalize_answer(pred), normalize_answer(gold)
    if (p in _SPECIAL_ANSWERS or g in _SPECIAL_ANSWERS) and p != g:
        return 0.0
    common = Counter(p.split()) & Counter(g.split())
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(p.split())
    recall = overlap / len(g.split())
    return 2 * precision * recall / (precision + recall)


def f1_score(pred: str | None, golds: Sequence[str] | str) -> float:
    """Token F1 between normalized prediction and gold, the max over golds (SQuAD / HotpotQA).

    Tokens are the whitespace words of the normalized strings, counted with multiplicity.
    Yes/no questions: when either side normalizes to "yes", "no" or "noanswer" and the two
    differ, F1 is 0, so "no" earns nothing against "yes" and "yes it is" earns nothing against
    "yes" (only an exact yes/no counts). Empty prediction or gold: 0.
    """
    gold_list = _gold_list(golds)
    if pred is None:
        return 0.0
    return max(_f1_one(pred, gold) for gold in gold_list)


Score = Annotated[float, Strict(), Field(ge=0, le=1)]
"""A reward component: a number in [0, 1] (text such as "0.2" is refused: these are set in
code, where a string is a bug)."""


@section(key="format_reward")
class FormatRewardConfig:
    """Format-aware reward (Search-R1 v0.3 scheme). Off by default: the reward is then pure EM.

    When enabled, with "correct" meaning the metric gives 1:
      correct answer, valid format    -> 1
      correct answer, invalid format  -> 1 - structure_score
      wrong answer, valid format      -> structure_score, plus retrieval_score when some
                                         retrieved text contains a gold answer (normalized)
      wrong answer, invalid format    -> final_format_score if an answer was extracted, else 0
    """

    structure_score: Score = 0.2
    """reward of a valid format with a wrong answer (and what an invalid format costs a right
    one)"""
    final_format_score: Score = 0.1
    """reward of an invalid format that still extracted an answer"""
    retrieval_score: Score = 0.1
    """extra reward of a valid format whose retrieved text contains a gold answer"""
    enabled: bool = False
    """use this scheme instead of plain exact match"""


def _elements(response_text: str) -> list[tuple[str, str]] | None:
    """(tag, content) for each element in order, or None when the text is not a flat sequence.

    Not flat: text other than whitespace between elements, an unmatched closing tag, an
    unclosed element, or a tag nested inside think/search/answer. Information content is the
    environment's retrieved text and is not inspected.
    """
    elements: list[tuple[str, str]] = []
    pos = 0
    while True:
        match = _ANY_TAG.search(response_text, pos)
        if match is None:
            return None if response_text[pos:].strip() else elements
        if response_text[pos : match.start()].strip() or match.group(1):
            return None
        name = match.group(2)
        close = f"</{name}>"
        close_at = response_text.find(close, match.end())
        if close_at < 0:
            return None
        content = response_text[match.end() : close_at]
        if name != "information" and _ANY_TAG.search(content):
            return None
        elements.append((name, content))
        pos = close_at + len(close)


def is_valid_sequence(response_text: str) -> bool:
    """True when the response is think -> (search -> information -> think)* -> answer.

    Only whitespace may sit between and around the elements; tags may not nest; every search
    has a non-empty query. A corrective message inside the response (after an invalid action or
    a search over budget) therefore makes it invalid.
    """
    elements = _elements(response_text)
    if not elements:
        return False
    if any(name == "search" and not content.strip() for name, content in elements):
        return False
    return _VALID_ORDER.fullmatch("".join(_LETTER[name] for name, _ in elements)) is not None


@dataclass
class RewardResult:
    reward: float
    em: float
    f1: float
    sub_em: float
    answer: str | None
    valid_format: bool


def _retrieval_has_gold(texts: Sequence[str], golds: Sequence[str]) -> bool:
    normalized = [normalize_answer(t) for t in texts]
    gold_norm = [g for g in (normalize_answer(gold) for gold in golds) if g]
    return any(g in t for t in normalized for g in gold_norm)


def compute_reward(
    response_text: str,
    golds: Sequence[str] | str,
    *,
    metric: str = "em",
    format_config: FormatRewardConfig | None = None,
    retrieved_texts: Sequence[str] | None = None,
) -> RewardResult:
    """Score one response text. Default: the metric of the last answer (EM: 1 or 0; no answer: 0).

    The answer is `extract_answer(response_text)`, the last complete answer span of the model's
    text, for callers that only have the text. A rollout whose turns are known should score its
    final answer action instead: `score_answer(final_answer(turns), ...)`.
    `metric` picks the reward ("em", "f1" or "sub_em"); all three are reported regardless.
    With `format_config.enabled` the reward follows `FormatRewardConfig` (binary metrics only).
    `retrieved_texts` are the passages retrieved during the rollout; when None, the contents of
    the information blocks in `response_text` are used for the retrieval bonus.
    """
    return score_answer(
        extract_answer(response_text),
        golds,
        response_text=response_text,
        metric=metric,
        format_config=format_config,
        retrieved_texts=retrieved_texts,
    )


def score_answer(
    answer: str | None,
    golds: Sequence[str] | str,
    *,
    response_text: str = "",
    metric: str = "em",
    format_config: FormatRewardConfig | None = None,
    retrieved_texts: Sequence[str] | None = None,
) -> RewardResult:
    """Score an answer already taken from the rollout (None: the rollout gave no answer).

    The metrics read `answer` only. `response_text` (the whole response, observations included)
    is read for the tag-sequence check (`RewardResult.valid_format`, and the format reward) and,
    when `retrieved_texts` is None, for the retrieval bonus; it is never searched for an answer.
    `metric`, `format_config` and `retrieved_texts` are as in `compute_reward`.
    """
    if metric not in METRICS:
        raise ConfigError(f"reward metric must be one of {', '.join(METRICS)}, got {metric!r}")
    gold_list = _gold_list(golds)
    scores = {
        "em": exact_match(answer, gold_list),
        "f1": f1_score(answer, gold_list),
        "sub_em": substring_match(answer, gold_list),
    }
    valid = is_valid_sequence(response_text)
    score = scores[metric]
    if format_config is None or not format_config.enabled:
        reward = score
    else:
        if metric not in _BINARY_METRICS:
            allowed = ", ".join(_BINARY_METRICS)
            raise ConfigError(f"format_reward needs a binary metric ({allowed}), got {metric!r}")
        cfg = format_config
        if score == 1.0:
            reward = 1.0 if valid else 1.0 - cfg.structure_score
        elif valid:
            texts = (
                retrieved_texts
                if retrieved_texts is not None
                else _INFO_BLOCK.findall(response_text)
            )
            bonus = cfg.retrieval_score if _retrieval_has_gold(texts, gold_list) else 0.0
            reward = cfg.structure_score + bonus
        else:
            reward = cfg.final_format_score if answer is not None else 0.0
    return RewardResult(reward, scores["em"], scores["f1"], scores["sub_em"], answer, valid)
