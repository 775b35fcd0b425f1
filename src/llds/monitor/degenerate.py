"""Degenerate text the reward cannot see.

Exact match normalizes answers the way Search-R1 does (lower case, no punctuation, no articles),
and BM25 drops punctuation from queries, so a policy that pads its queries and answers with one
punctuation character (`<answer> Kulban))))))) </answer>`) keeps its reward. In the LLD study a
GRPO run did exactly that on every held-out question while its EM held; this share shows it in
the training log.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

PUNCTUATION_RUN = re.compile(r"([^\w\s<>/])\1{4,}")
"""Five or more of the same punctuation character in a row (the tags' brackets and slashes
aside)."""


def punctuation_run_frac(texts: Sequence[str]) -> float:
    """Share of `texts` (one per rollout: what the model wrote) with such a run; 0 for none."""
    if not texts:
        return 0.0
    return sum(bool(PUNCTUATION_RUN.search(t)) for t in texts) / len(texts)
