"""The device-resident decode loop over a static key/value cache (`rollout.cache: static`).

One `StaticSession` serves one chunk of rollouts. Its state lives in tensors on the model's
device: each row's cache length (the position of its next token), its seed, the turn's token,
log-prob and entropy buffers, its budget and whether it is still in its turn. Per sampled token
the loop runs the model step, the sampler and a few element-wise updates; the host looks at
two small tensors (is any row still in its turn; did a row sample a token whose text holds a
`>`, after which a stop tag may be complete) every `check_every` tokens, and reads the turn's
tokens once when the turn is over.

A stop tag found at a check can be some tokens back (with `check_every > 1`): the row then
decoded past it, and is rolled back to it. That is exact: the tokens after the stop are
dropped, their cache slots are overwritten by the next prefill, and the sampling noise is a
function of (seed, position), so nothing drawn after the stop changes what comes next.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from llds.algo.logprobs import token_log_probs_and_entropy
from llds.models.static_decoder import StaticDecoder
from llds.rollout.config import RolloutConfig
from llds.rollout.sampling import sample_next_token
from llds.rollout.stopping import StopChecker
from llds.rollout.turn_tokens import TurnTokens

SHRINK = 0.75
"""Active rows move to the front of the cache once at most this share of the computed rows is
still in its turn (a copy of the rows that swap places, paid back within a few steps)."""


class StaticSession:
    """The rows of one chunk on one static cache, from the prompts to the last turn."""

    def __init__(
        self,
        decoder: StaticDecoder,
        config: RolloutConfig,
        prompts: Sequence[Sequence[int]],
        seeds: Tensor,
        *,
        eos_ids: set[int],
        candidates: Tensor,
        stop: StopChecker,
        pad_id: int,
        check_every: int,
        compact: bool,
        stats: dict[str, int],
    ) -> None:
        if decoder.rows < len(prompts):
            raise ValueError(f"a decoder of {decoder.rows} rows cannot serve {len(prompts)}")
        self.cfg = config
        self.device = decoder.device
        self.decoder = decoder  # its cache rows [0, len(prompts)) are this chunk's
        self.seeds = seeds.to(self.device)
        self.stop = stop
        self.pad_id = pad_id
        self.check_every = check_every
        self.compact = compact
        self.stats = stats
        vocab = candidates.numel()  # one flag per id of the model's output vocabulary
        self.is_eos = torch.zeros(vocab, dtype=torch.bool, device=self.device)
        self.eos_cols = torch.tensor(sorted(eos_ids), dtype=torch.long, device=self.device)
        self.is_eos[self.eos_cols[self.eos_cols < vocab]] = True
        self.candidates = candidates
        self.policy_temp = config.temperature if config.temperature > 0 else 1.0
        self.live: list[int] = list(range(len(prompts)))  # cache row of each live rollout
        self.lengths = torch.zeros(len(prompts), dtype=torch.long, device=self.device)
        self.logits = self._prefill_prompts(prompts)

    # ------------------------------------------------------------------ prefill
    def _prefill_prompts(self, prompts: Sequence[Sequence[int]]) -> Tensor:
        """Each distinct prompt once (a GRPO group shares one): with `rollout.prefix_sharing`
        and `share_decode_prompts` cached once for its rows (`StaticDecoder.share_prompts`),
        else copied to its other rows."""
        first: dict[tuple[int, ...], int] = {}
        owner = [first.setdefault(tuple(p), r) for r, p in enumerate(prompts)]
        leaders = sorted(set(owner))
        if self.cfg.prefix_sharing and self.cfg.share_decode_prompts:
            return self._share_prompts(prompts, leaders, owner)
        self.decoder.unshare()
        logits = self._prefill([list(prompts[r]) for r in leaders], leaders)  # lengths are 0
        by_leader = dict(zip(leaders, range(len(leaders)), strict=True))
        widest = max(len(p) for p in prompts)
        followers = [r for r in range(len(prompts)) if owner[r] != r]
        if followers:
            src = torch.tensor([owner[r] for r in followers], device=self.device)
            dst = torch.tensor(followers, device=self.device)
            self.decoder.copy_rows(src, dst, widest)
        self.lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        self.stats["prefill_tokens"] += sum(len(prompts[r]) for r in leaders)
        return logits[torch.tensor([by_leader[o] for o in owner], device=self.device)]

    def _share_prompts(
        self, prompts: Sequence[Sequence[int]], leaders: list[int], owner: list[int]
    ) -> Tensor:
        """The distinct prompts into the decoder's shared prompt cache, one group each; the
        logits after each row's prompt."""
        group_of = {leader: u for u, leader in enumerate(leaders)}
        width = max(len(prompts[r]) for r in leaders)
        ids = torch.full((len(leaders), width), self.pad_id, dtype=torch.long)
        for u, r in enumerate(leaders):
            ids[u, : len(prompts[r])] = torch.tensor(list(prompts[r]), dtype=torch.long)
        lengths = torch.tensor([len(prompts[r]) for r in leaders], device=self.device)
        row_group = torch.tensor([group_of[o] for o in owner], device=self.device)
        self.stats["forward_calls"] += 1
        self.stats["prefill_tokens"] += sum(len(prompts[r]) for r in leaders)
        logits = self.decoder.share_prompts(ids.to(self.device), lengths, row_group.clone())
        self.lengths = lengths[row_group]
        return logits[row_group]

    def _prefill(self, feed: list[list[int]], rows: list[int]) -> Tensor:
        """Write `feed[i]` after row `rows[i]`'s cached tokens; the logits after each."""
        width = max(len(f) for f in feed)
        ids = torch.full((len(feed), width), self.pad_id, dtype=torch.long)
        for i, f in enumerate(feed):
            ids[i, : len(f)] = torch.tensor(f, dtype=torch.long)
        index = torch.tensor(rows, device=self.device)
        lengths = torch.tensor([len(f) for f in feed], device=self.device)
        self.stats["forward_calls"] += 1
        return self.decoder.prefill(ids.to(self.device), lengths, self.lengths[index], index)

    # ------------------------------------------------------------------ one turn
    def decode_turn(self, budgets: Sequence[int]) -> list[TurnTokens]:
        """Sample one turn for every live rollout, `budgets[i]` tokens at most for live
        rollout `i` (0: it gets no turn); returns the live rollouts' turns in order.

        With `compact`, rows whose turn is over leave the computed prefix of the cache once at
        most `SHRINK` of it is still active: they move behind the active rows (their last token
        then leads the next prefill), so a step reads and computes only the active rows."""
        dev = self.device
        total = self.lengths.numel()
        budget = torch.zeros(total, dtype=torch.long, device=dev)
        budget[torch.tensor(self.live, device=dev)] = torch.tensor(budgets, device=dev)
        longest = max(budgets, default=0)
        self.turn_start = self.lengths.clone()
        state = _TurnState(total, longest, budget, dev)
        if longest <= 0:
            return self._collect(state)
        logits = self.logits
        prefix = total  # rows [0, prefix) are computed
        bound = int(self.lengths.max()) + 1  # every row's next position stays below it
        self.decoder.reserve(bound + longest)  # the whole turn, grown once
        checked = 0  # columns whose stop candidates the host has decided
        for col in range(longest):
            tok, lp, ent = self._sample(logits[:prefix], state.count[:prefix], prefix)
            was_active = state.active[:prefix].clone()
            state.record(col, prefix, tok, lp, ent, self._stops(tok, was_active, state, prefix))
            if col + 1 == longest or col + 1 - checked >= self.check_every:
                self._check_stops(state, checked, col + 1)
                checked = col + 1
                left = int(state.active.sum())
                if left == 0:
                    break  # the tokens of this step stay unfed: they lead the next prefill
                if self.compact and left <= SHRINK * prefix:
                    order, prefix = self._to_front(state.active)
                    state.permute(order)
                    logits, tok = logits[order], tok[order[:prefix]]
                    was_active = state.active[:prefix]
            self.stats["decode_tokens"] += int(was_active[:prefix].sum())
            self.stats["forward_calls"] += 1
            logits[:prefix] = self.decoder.step(tok[:prefix], self.lengths[:prefix], bound)
            bound += 1
            self.lengths[:prefix] += was_active[:prefix]
        # a row rolled back to an earlier stop tag has cache slots past it: they are dropped
        self.lengths = torch.minimum(self.lengths, self.turn_start + state.count)
        self.logits = logits
        return self._collect(state)

    def _stops(self, tok: Tensor, was_active: Tensor, state: _TurnState, prefix: int):
        """(ended, may_stop, full) of the prefix rows after sampling `tok`: an end-of-sequence
        token; a token after which a stop tag may be complete (decided on the host); the
        budget reached."""
        cfg = self.cfg
        count = state.count[:prefix] + was_active
        ended = self.is_eos[tok] & was_active
        may_stop = self.candidates[tok] & was_active & ~ended
        if cfg.min_turn_tokens:  # stop tags count from the minimum on, complete ones too
            may_stop &= count >= cfg.min_turn_tokens
            may_stop |= was_active & ~ended & (count == cfg.min_turn_tokens)
        full = was_active & ~ended & (count >= state.budget[:prefix])
        return ended, may_stop, full

    def _to_front(self, front: Tensor) -> tuple[Tensor, int]:
        """Move the `n` rows marked in `front` to rows `[0, n)` of the cache, swapping each
        one still behind with an unmarked row ahead (only those rows are copied). Returns the
        swap as an order over the rows (its own inverse) and `n`."""
        n = int(front.sum())
        leave = (~front[:n]).nonzero().flatten()
        enter = front[n:].nonzero().flatten() + n
        order = torch.arange(front.numel(), device=self.device)
        if leave.numel():
            order[leave], order[enter] = enter, leave
            self.decoder.swap_rows(leave, enter, int(self.lengths.max()) + 1)
        self.lengths, self.seeds = self.lengths[order], self.seeds[order]
        self.turn_start = self.turn_start[order]
        self.live = order[torch.tensor(self.live, device=self.device)].tolist()
        return order, n

    def _sample(self, logits: Tensor, count: Tensor, prefix: int) -> tuple[Tensor, Tensor, Tensor]:
        cfg = self.cfg
        scores = logits
        if cfg.min_turn_tokens and self.eos_cols.numel():
            young = (count < cfg.min_turn_tokens)[:, None]
            scores = logits.clone()
            scores[:, self.eos_cols] = scores[:, self.eos_cols].masked_fill(young, float("-inf"))
        tok = sample_next_token(
            scores,
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            row_seeds=self.seeds[:prefix],
            positions=self.lengths[:prefix],
        )
        # pi_old of the sampled tokens, from the logits we already have: the policy's own
        # distribution (unfiltered, unmasked), at the trainer's temperature
        lp, ent = token_log_probs_and_entropy(logits, tok, temperature=self.policy_temp)
        return tok, lp, ent

    def _check_stops(self, state: _TurnState, lo: int, hi: int) -> None:
        """Decide the stop candidates of columns `[lo, hi)` on the host with `StopChecker`:
        a row whose turn has a stop tag complete there ends at its first one (rolled back to
        it when it decoded on)."""
        window = state.cand[:, lo:hi]
        if not bool(window.any()):
            return
        rows = window.any(dim=1).nonzero().flatten().tolist()
        seen = state.tokens[rows, :hi].tolist()
        for r, ids, flags in zip(rows, seen, window[rows].tolist(), strict=True):
            for j, flag in enumerate(flags, start=lo):
                if flag and self.stop.hit_stop_string(ids[: j + 1]):
                    state.active[r], state.out_of_budget[r], state.count[r] = False, False, j + 1
                    break

    def _collect(self, state: _TurnState) -> list[TurnTokens]:
        """The live rollouts' turns, read from the device once."""
        index = torch.tensor(self.live, device=self.device)
        n = state.count[index].tolist()
        width = max(n, default=0)
        ids = state.tokens[index, :width].tolist()
        lp = state.lps[index, :width].tolist()
        ent = state.ents[index, :width].tolist()
        oob = state.out_of_budget[index].tolist()
        return [
            TurnTokens(ids[i][: n[i]], lp[i][: n[i]], ent[i][: n[i]], oob[i]) for i in range(len(n))
        ]

    # ------------------------------------------------------------------ between turns
    def advance(self, keep: Sequence[int], turns: Sequence[TurnTokens], observations) -> None:
        """Live rollouts `keep` (indices into the live rollouts) go on, the others are done.
        Each kept rollout gets the tokens of its turn the cache has not seen (the last one,
        when its turn ended before it was fed) and its observation."""
        rows = [self.live[i] for i in keep]
        written = (self.lengths - self.turn_start).tolist()
        feed = [
            turns[i].ids[written[r] :] + list(obs)
            for i, r, obs in zip(keep, rows, observations, strict=True)
        ]
        if not rows:
            self.live = []
            return
        self.live = rows
        if self.compact and len(rows) < self.lengths.numel():
            front = torch.zeros(self.lengths.numel(), dtype=torch.bool, device=self.device)
            front[torch.tensor(rows, device=self.device)] = True
            order, n = self._to_front(front)
            self.lengths, self.seeds = self.lengths[:n], self.seeds[:n]
            self.turn_start, self.logits = self.turn_start[:n], self.logits[order[:n]]
            rows = self.live
        # the stats count prompts and observations (a turn's unfed last token is a decode token)
        self.stats["prefill_tokens"] += sum(len(o) for o in observations)
        self.stats["decode_tokens"] += sum(
            len(f) - len(o) for f, o in zip(feed, observations, strict=True)
        )
        logits = self._prefill(feed, rows)
        index = torch.tensor(rows, device=self.device)
        self.lengths[index] += torch.tensor([len(f) for f in feed], device=self.device)
        self.logits[index] = logits


class _TurnState:
    """The per-row tensors of one turn, on the device."""

    def __init__(self, rows: int, longest: int, budget: Tensor, device: torch.device) -> None:
        width = max(longest, 1)
        self.budget = budget
        self.tokens = torch.zeros(rows, width, dtype=torch.long, device=device)
        self.lps = torch.zeros(rows, width, dtype=torch.float32, device=device)
        self.ents = torch.zeros(rows, width, dtype=torch.float32, device=device)
        self.cand = torch.zeros(rows, width, dtype=torch.bool, device=device)
        self.active = budget > 0
        self.out_of_budget = torch.zeros(rows, dtype=torch.bool, device=device)
        self.count = torch.zeros(rows, dtype=torch.long, device=device)  # sampled this turn

    def record(self, col: int, prefix: int, tok, lp, ent, stops) -> None:
        """Column `col` of the prefix rows: their sampled token and what it did."""
        ended, may_stop, full = stops
        was_active = self.active[:prefix]
        self.tokens[:prefix, col], self.lps[:prefix, col], self.ents[:prefix, col] = tok, lp, ent
        self.cand[:prefix, col] = may_stop
        self.count[:prefix] += was_active
        self.out_of_budget[:prefix] |= full
        self.active[:prefix] = was_active & ~ended & ~full

    def permute(self, order: Tensor) -> None:
        for name in ("budget", "tokens", "lps", "ents", "cand", "active", "out_of_budget", "count"):
            setattr(self, name, getattr(self, name)[order])
