"""Turn statistics of a rollout batch: how many turns, how many of them void, how many searches.

A void turn (SimpleTIR, arXiv 2509.02479) emits neither a valid search nor an answer; rollouts
that contain one drive gradient blow-ups in multi-turn tool RL, so their share is watched.
"""

from __future__ import annotations

from collections.abc import Sequence

from llds import metrics as keys
from llds.env.actions import parse_action


def void_turn_count(action_texts: Sequence[str]) -> int:
    """The turns of one rollout whose text parses as neither a search nor an answer.

    Counted from the turns' text with the engine's own parser, so it includes the rollout's
    last turn, which `Episode.num_invalid` leaves out (the engine counts an invalid turn only
    when the rollout goes on and the turn gets the corrective observation)."""
    return sum(1 for text in action_texts if parse_action(text).kind == "invalid")


def turn_metrics(
    turns: Sequence[int], void_turns: Sequence[int], valid_searches: Sequence[int]
) -> dict[str, float]:
    """Per rollout: mean turns, share of rollouts with a void turn, and valid searches per turn
    (pooled: all valid searches over all turns). `{}` for no rollouts; the search share is left
    out when there were no turns."""
    n = len(turns)
    if len(void_turns) != n or len(valid_searches) != n:
        raise ValueError(
            f"turn_metrics needs one count per rollout: got {n} turns, {len(void_turns)} void "
            f"turn counts and {len(valid_searches)} valid search counts"
        )
    if n == 0:
        return {}
    total_turns = sum(turns)
    out = {
        keys.TURNS_PER_ROLLOUT: total_turns / n,
        keys.TURNS_VOID_SHARE: sum(1 for v in void_turns if v > 0) / n,
    }
    if total_turns > 0:
        out[keys.TURNS_VALID_SEARCH_SHARE] = sum(valid_searches) / total_turns
    return out
