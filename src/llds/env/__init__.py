"""The Search-R1 search protocol as pure functions: tags, action parsing, observations, prompts,
rewards. The rollout engine, SFT data builder and trainer all speak it through these names."""

from llds.env.actions import Action, first_stop_index, parse_action
from llds.env.observation import (
    format_hits,
    information_block,
    invalid_action_message,
    search_limit_message,
    truncate_to_tokens,
)
from llds.env.prompts import DEFAULT_INSTRUCTION, PromptTemplate, build_prompt, build_prompt_ids
from llds.env.rewards import (
    FormatRewardConfig,
    RewardResult,
    compute_reward,
    exact_match,
    extract_answer,
    f1_score,
    is_valid_sequence,
    normalize_answer,
    substring_match,
)
from llds.env.tags import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    INFO_CLOSE,
    INFO_OPEN,
    PROTOCOL_TOKENS,
    SEARCH_CLOSE,
    SEARCH_OPEN,
    STOP_STRINGS,
    THINK_CLOSE,
    THINK_OPEN,
)

__all__ = [
    "ANSWER_CLOSE",
    "ANSWER_OPEN",
    "DEFAULT_INSTRUCTION",
    "INFO_CLOSE",
    "INFO_OPEN",
    "PROTOCOL_TOKENS",
    "SEARCH_CLOSE",
    "SEARCH_OPEN",
    "STOP_STRINGS",
    "THINK_CLOSE",
    "THINK_OPEN",
    "Action",
    "FormatRewardConfig",
    "PromptTemplate",
    "RewardResult",
    "build_prompt",
    "build_prompt_ids",
    "compute_reward",
    "exact_match",
    "extract_answer",
    "f1_score",
    "first_stop_index",
    "format_hits",
    "information_block",
    "invalid_action_message",
    "is_valid_sequence",
    "normalize_answer",
    "parse_action",
    "search_limit_message",
    "substring_match",
    "truncate_to_tokens",
]
