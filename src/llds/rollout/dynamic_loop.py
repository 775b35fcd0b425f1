"""The eager decode loop over transformers' own cache (`rollout.cache: dynamic`).

Serves every model transformers can run (any architecture, any attention, FSDP-sharded or
wrapped), at the cost of a host round trip per token: the reference the static loop is checked
against. Finished rows leave the batch between turns; rows whose turn is over wait, fed a
masked pad, while the others finish theirs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from llds.algo.logprobs import token_log_probs_and_entropy
from llds.models.kv_cache import cache_argument, returned_cache
from llds.rollout.config import RolloutConfig
from llds.rollout.sampling import sample_next_token
from llds.rollout.stopping import StopChecker
from llds.rollout.turn_tokens import TurnTokens


class DynamicSession:
    """The rows of one chunk, decoded with transformers' `DynamicCache` (or the `llds_grouped`
    slab cache), one host round trip per token."""

    def __init__(
        self,
        model,
        config: RolloutConfig,
        prompts: Sequence[Sequence[int]],
        seeds: Tensor,
        *,
        eos_ids: set[int],
        stop: StopChecker,
        pad_id: int,
        stats: dict[str, int],
    ) -> None:
        self.model = model
        self.cfg = config
        self.device = next(model.parameters()).device
        self.seeds = seeds
        self.eos_ids = eos_ids
        self.eos_cols = torch.tensor(sorted(eos_ids), dtype=torch.long, device=self.device)
        self.stop = stop
        self.pad_id = pad_id
        self.stats = stats
        self.policy_temp = config.temperature if config.temperature > 0 else 1.0
        self.contexts = [list(p) for p in prompts]  # every token of each live row so far
        self.pending = [list(p) for p in prompts]  # not yet in the cache
        self.cache, self.cache_mask = None, None

    # ------------------------------------------------------------------ forward passes
    def _forward(self, feed: list[list[int]], cache, cache_mask: Tensor | None):
        """Left-pad `feed` rows, run them after `cache`, return last-position logits."""
        device = self.device
        width = max(len(f) for f in feed)
        ids = torch.full((len(feed), width), self.pad_id, dtype=torch.long, device=device)
        mask = torch.zeros((len(feed), width), dtype=torch.long, device=device)
        for i, f in enumerate(feed):
            if f:
                ids[i, width - len(f) :] = torch.tensor(f, dtype=torch.long, device=device)
                mask[i, width - len(f) :] = 1
        full_mask = mask if cache_mask is None else torch.cat([cache_mask, mask], dim=1)
        positions = (full_mask.cumsum(-1) - 1).clamp(min=0)[:, -width:]
        if cache is None:  # the model builds its own, unless its attention needs ours
            from llds.models.grouped_attention import decode_cache_for  # imports transformers

            cache = decode_cache_for(self.model)
        out = self.model(
            input_ids=ids,
            attention_mask=full_mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{cache_argument(self.model): cache},
        )
        self.stats["forward_calls"] += 1
        return out.logits[:, -1, :], returned_cache(out), full_mask

    def _prefill(self) -> Tensor:
        """Run the pending tokens; without a cache yet, rows with the same prompt (a GRPO
        group) share one prefill whose keys/values are then copied out to every row."""
        pending = self.pending
        if self.cache is None:
            distinct: dict[tuple[int, ...], int] = {}
            inverse = [distinct.setdefault(tuple(f), len(distinct)) for f in pending]
            if len(distinct) < len(pending):
                self.stats["prefill_tokens"] += sum(len(f) for f in distinct)
                logits, cache, mask = self._forward([list(f) for f in distinct], None, None)
                idx = torch.tensor(inverse, device=logits.device)
                cache.batch_select_indices(idx)
                self.cache, self.cache_mask = cache, mask[idx]
                return logits[idx]
        self.stats["prefill_tokens"] += sum(len(f) for f in pending)
        logits, self.cache, self.cache_mask = self._forward(pending, self.cache, self.cache_mask)
        return logits

    # ------------------------------------------------------------------ one turn
    def decode_turn(self, budgets: Sequence[int]) -> list[TurnTokens]:
        """Sample one turn for every live row, `budgets[i]` tokens at most for row `i`."""
        cfg = self.cfg
        if not cfg.kv_reuse:  # re-prefill the whole context every turn (the baseline)
            self.cache, self.cache_mask = None, None
            self.pending = [list(c) for c in self.contexts]
        logits = self._prefill()
        n_rows = len(budgets)
        turn_ids: list[list[int]] = [[] for _ in range(n_rows)]
        turn_lp: list[list[float]] = [[] for _ in range(n_rows)]
        turn_ent: list[list[float]] = [[] for _ in range(n_rows)]
        active = [b > 0 for b in budgets]
        out_of_budget = [False] * n_rows
        while any(active):
            # sample only rows still in their turn: a stopped row must not consume randomness
            act = [r for r in range(n_rows) if active[r]]
            policy = logits[act]
            scores = policy
            if cfg.min_turn_tokens:
                young = [k for k, r in enumerate(act) if len(turn_ids[r]) < cfg.min_turn_tokens]
                if young and self.eos_ids:
                    rows = torch.tensor(young, device=scores.device)[:, None]
                    scores = scores.clone()
                    scores[rows, self.eos_cols] = float("-inf")
            positions = [len(self.contexts[r]) + len(turn_ids[r]) for r in act]
            picked_t = sample_next_token(
                scores,
                temperature=cfg.temperature,
                top_k=cfg.top_k,
                top_p=cfg.top_p,
                row_seeds=self.seeds[act],
                positions=torch.tensor(positions, device=self.device),
            )
            # pi_old of the sampled tokens, from the logits we already have: the policy's own
            # distribution (unfiltered, unmasked), at the trainer's temperature
            lp, ent = token_log_probs_and_entropy(
                policy, picked_t.to(policy.device), temperature=self.policy_temp
            )
            tokens: list[int | None] = [None] * n_rows
            for r, tok_id, p, h in zip(
                act, picked_t.tolist(), lp.tolist(), ent.tolist(), strict=True
            ):
                tokens[r] = tok_id
                turn_lp[r].append(p)
                turn_ent[r].append(h)
            feed: list[list[int]] = []
            for row, tok in enumerate(tokens):
                if tok is None:
                    feed.append([])
                    continue
                turn_ids[row].append(tok)
                n = len(turn_ids[row])
                if tok in self.eos_ids or (
                    n >= cfg.min_turn_tokens and self.stop.hit_stop_string(turn_ids[row])
                ):
                    active[row] = False  # the turn ended itself (EOS or a stop tag)
                elif n >= budgets[row]:
                    active[row] = False
                    out_of_budget[row] = True
                # a row's last token of the turn is not fed now: it leads the next prefill
                feed.append([tok] if active[row] else [])
            if any(active):
                self.stats["decode_tokens"] += sum(bool(f) for f in feed)
                logits, self.cache, self.cache_mask = self._forward(
                    feed, self.cache, self.cache_mask
                )
        self.pending = [[ids[-1]] if ids else [] for ids in turn_ids]
        return [
            TurnTokens(turn_ids[r], turn_lp[r], turn_ent[r], out_of_budget[r])
            for r in range(n_rows)
        ]

    # ------------------------------------------------------------------ between turns
    def advance(self, keep: Sequence[int], turns: Sequence[TurnTokens], observations) -> None:
        """Rows `keep` go on with their observations; finished rows leave the cache."""
        self.pending = [self.pending[r] + list(o) for r, o in zip(keep, observations, strict=True)]
        self.contexts = [
            self.contexts[r] + turns[r].ids + list(o)
            for r, o in zip(keep, observations, strict=True)
        ]
        self.seeds = self.seeds[list(keep)]
        if self.cache is not None and len(keep) < self.cache_mask.shape[0]:
            self.cache.batch_select_indices(torch.tensor(list(keep), device=self.device))
            self.cache_mask = self.cache_mask[list(keep)]
