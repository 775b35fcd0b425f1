"""One step of the Search-R1 environment: what a finished model turn leads to.

A pure function of the turn's text and the room left, so the protocol's rules are tested
without a model and are the same for every decode loop that produces the turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llds.env.actions import Action, parse_action

StopReason = Literal["answer", "turn_limit", "context_limit"]


@dataclass(frozen=True)
class Transition:
    """What the environment does after one turn.

    `done` with its `stop_reason` ends the rollout; otherwise the environment executes
    `action.content` as a search (`action.kind == "search"`) or answers an invalid action with
    the corrective message, and the observation may take at most `room` tokens.
    """

    action: Action
    done: bool
    stop_reason: StopReason | None
    context_capped: bool
    """the total context cap ended the rollout (no room left after this turn)"""
    room: int
    """tokens left under `rollout.max_total_tokens` after this turn"""


def step(text: str, *, used_tokens: int, max_total_tokens: int, final_turn: bool) -> Transition:
    """The transition after a turn whose text is `text`, with `used_tokens` (prompt and
    response, this turn included) of `max_total_tokens` spent; `final_turn` when no further
    turn is allowed.

    Search-R1's rule: the turn is parsed whatever ended it (stop tag, end-of-sequence or
    budget). An answer ends the rollout; otherwise the last allowed turn or a full context
    ends it ("context_limit" wins over "turn_limit"); otherwise the rollout goes on.
    """
    room = max_total_tokens - used_tokens
    action = parse_action(text)
    if action.kind == "answer":
        return Transition(action, True, "answer", False, room)
    if room <= 0:
        return Transition(action, True, "context_limit", True, room)
    if final_turn:
        return Transition(action, True, "turn_limit", False, room)
    return Transition(action, False, None, False, room)
