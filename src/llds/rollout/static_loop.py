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


class StaticSession:
    """The rows of one chunk on one static cache, from the prompts to the last turn."""

    def __init__(
        self,
        model,
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
        self.cfg = config
        self.device = next(model.parameters()).device
        self.decoder = StaticDecoder(model, len(prompts), config.max_total_tokens + 1)
        self.seeds = seeds.to(self.device)
        self.stop = stop
        self.pad_id = pad_id
        self.check_every = check_every
        self.compact = compact
        self.stats = stats
        vocab = self._vocab(model)
        self.is_eos = torch.zeros(vocab, dtype=torch.bool, device=self.device)
        self.eos_cols = torch.tensor(sorted(eos_ids), dtype=torch.long, device=self.device)
        self.is_eos[self.eos_cols[self.eos_cols < vocab]] = True
        self.candidates = candidates
        self.policy_temp = config.temperature if config.temperature > 0 else 1.0
        self.live: list[int] = list(range(len(prompts)))  # cache row of each live rollout
        self.lengths = torch.zeros(len(prompts), dtype=torch.long, device=self.device)
        self.logits = self._prefill_prompts(prompts)

    @staticmethod
    def _vocab(model) -> int:
        return int(model.get_output_embeddings().weight.shape[0])

    # ------------------------------------------------------------------ prefill
    def _prefill_prompts(self, prompts: Sequence[Sequence[int]]) -> Tensor:
        """Each distinct prompt once (a GRPO group shares one), copied to its other rows."""
        first: dict[tuple[int, ...], int] = {}
        owner = [first.setdefault(tuple(p), r) for r, p in enumerate(prompts)]
        leaders = sorted(set(owner))
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
        """Sample one turn for every live row, `budgets[i]` tokens at most for live row `i`
        (0: the row gets no turn); returns the live rows' turns in order."""
        cfg, dev = self.cfg, self.device
        total = self.lengths.numel()
        budget = torch.zeros(total, dtype=torch.long, device=dev)
        budget[self.live] = torch.tensor(budgets, dtype=torch.long, device=dev)
        longest = max(budgets, default=0)
        self.turn_start = self.lengths.clone()
        if longest <= 0:
            return [TurnTokens([], [], [], False) for _ in budgets]
        tokens = torch.zeros(total, longest, dtype=torch.long, device=dev)
        lps = torch.zeros(total, longest, dtype=torch.float32, device=dev)
        ents = torch.zeros(total, longest, dtype=torch.float32, device=dev)
        cand = torch.zeros(total, longest, dtype=torch.bool, device=dev)
        active = budget > 0
        out_of_budget = torch.zeros(total, dtype=torch.bool, device=dev)
        count = torch.zeros(total, dtype=torch.long, device=dev)  # tokens sampled this turn
        logits = self.logits
        checked = 0  # columns whose stop candidates the host has decided
        for col in range(longest):
            tok, lp, ent = self._sample(logits, count)
            tokens[:, col], lps[:, col], ents[:, col] = tok, lp, ent
            was_active = active
            count = count + was_active
            ended = self.is_eos[tok] & was_active
            may_stop = self.candidates[tok] & was_active & ~ended
            if cfg.min_turn_tokens:  # stop tags count from the minimum on, complete ones too
                may_stop &= count >= cfg.min_turn_tokens
                may_stop |= was_active & ~ended & (count == cfg.min_turn_tokens)
            cand[:, col] = may_stop
            full = was_active & ~ended & (count >= budget)
            out_of_budget = out_of_budget | full
            active = was_active & ~ended & ~full
            if col + 1 == longest or col + 1 - checked >= self.check_every:
                active, out_of_budget, count = self._check_stops(
                    tokens, cand, checked, col + 1, active, out_of_budget, count
                )
                checked = col + 1
                if not bool(active.any()):
                    break  # the tokens of this step stay unfed: they lead the next prefill
            self.stats["decode_tokens"] += int(was_active.sum())
            self.stats["forward_calls"] += 1
            logits = self.decoder.step(tok, self.lengths)
            self.lengths = self.lengths + was_active
        # a row rolled back to an earlier stop tag has cache slots past it: they are dropped
        self.lengths = torch.minimum(self.lengths, self.turn_start + count)
        return self._collect(tokens, lps, ents, count, out_of_budget)

    def _sample(self, logits: Tensor, count: Tensor) -> tuple[Tensor, Tensor, Tensor]:
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
            row_seeds=self.seeds,
            positions=self.lengths,
        )
        # pi_old of the sampled tokens, from the logits we already have: the policy's own
        # distribution (unfiltered, unmasked), at the trainer's temperature
        lp, ent = token_log_probs_and_entropy(logits, tok, temperature=self.policy_temp)
        return tok, lp, ent

    def _check_stops(
        self,
        tokens: Tensor,
        cand: Tensor,
        lo: int,
        hi: int,
        active: Tensor,
        out_of_budget: Tensor,
        count: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Decide the stop candidates of columns `[lo, hi)` on the host with `StopChecker`:
        a row whose turn has a stop tag complete there ends at its first one (rolled back to
        it when it decoded on)."""
        window = cand[:, lo:hi]
        if not bool(window.any()):
            return active, out_of_budget, count
        rows = window.any(dim=1).nonzero().flatten().tolist()
        active, out_of_budget, count = active.clone(), out_of_budget.clone(), count.clone()
        for r, ids, flags in zip(
            rows, tokens[rows, :hi].tolist(), window[rows].tolist(), strict=True
        ):
            for j, flag in enumerate(flags, start=lo):
                if flag and self.stop.hit_stop_string(ids[: j + 1]):
                    active[r], out_of_budget[r], count[r] = False, False, j + 1
                    break
        return active, out_of_budget, count

    def _collect(self, tokens, lps, ents, count, out_of_budget) -> list[TurnTokens]:
        """The live rows' turns, read from the device once."""
        index = torch.tensor(self.live, device=self.device)
        n = count[index].tolist()
        width = max(n, default=0)
        ids = tokens[index, :width].tolist()
        lp = lps[index, :width].tolist()
        ent = ents[index, :width].tolist()
        oob = out_of_budget[index].tolist()
        return [
            TurnTokens(ids[i][: n[i]], lp[i][: n[i]], ent[i][: n[i]], oob[i]) for i in range(len(n))
        ]

    # ------------------------------------------------------------------ between turns
    def advance(self, keep: Sequence[int], turns: Sequence[TurnTokens], observations) -> None:
        """Live rows `keep` (indices into the live rows) go on, the others are done. Each kept
        row gets the tokens of its turn the cache has not seen (the last one, when its turn
        ended the loop) and its observation."""
        rows = [self.live[i] for i in keep]
        written = (self.lengths - self.turn_start).tolist()
        feed = [
            turns[i].ids[written[r] :] + list(obs)
            for i, r, obs in zip(keep, rows, observations, strict=True)
        ]
        if not rows:
            self.live = []
            return
        if self.compact and len(rows) < self.lengths.numel():
            index = torch.tensor(rows, device=self.device)
            self.decoder.select_rows(index)
            self.lengths, self.seeds = self.lengths[index], self.seeds[index]
            rows = list(range(len(rows)))
            self.logits = self.logits[index]
        self.live = rows
        # the stats count prompts and observations (a turn's unfed last token is a decode token)
        self.stats["prefill_tokens"] += sum(len(o) for o in observations)
        self.stats["decode_tokens"] += sum(
            len(f) - len(o) for f, o in zip(feed, observations, strict=True)
        )
        logits = self._prefill(feed, rows)
        index = torch.tensor(rows, device=self.device)
        self.lengths[index] += torch.tensor([len(f) for f in feed], device=self.device)
        self.logits[index] = logits
