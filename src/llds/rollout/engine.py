"""Batched multi-turn rollouts of a Hugging Face causal LM against a search environment.

All live episodes of a chunk decode together. A turn ends per row at the first closing
`</search>` / `</answer>`, an end-of-sequence token, or its token budget (the per-turn cap, or
less when the total context cap leaves less room). Whatever ended it, the turn is then parsed
as an action (Search-R1's rule): an answer ends the rollout; a complete search is executed; a
turn with no complete search/answer span is an invalid action that gets the corrective message
as its observation, and the rollout goes on while turns and context remain. All searches of the
turn go to the retriever in one call; observations are appended as tokens; finished rows drop
out of the batch. With `kv_reuse` the key/value cache survives across turns, so each turn only
prefills the new observation tokens instead of the whole context again.

The ids the model sampled are kept verbatim (an end-of-sequence token that ended a turn too):
nothing is decoded and re-tokenized. The reward and the LLDS-MA answer mask read only the final
answer action, the answer span of the last turn when that turn is an answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from llds.algo.logprobs import token_log_probs_and_entropy
from llds.env.actions import parse_action
from llds.env.observation import information_block, invalid_action_message
from llds.env.rewards import FormatRewardConfig, final_answer, score_answer
from llds.errors import ConfigError
from llds.models.kv_cache import cache_argument, returned_cache
from llds.retrieval.base import Retriever
from llds.rollout.batch import Episode, RolloutBatch
from llds.rollout.config import RolloutConfig
from llds.rollout.sampling import sample_next_token
from llds.rollout.spans import mark_answer_span
from llds.rollout.stopping import StopChecker, eos_token_ids


@dataclass(frozen=True)
class RolloutRequest:
    """One episode to generate: a tokenized prompt and the answers that score it."""

    prompt_ids: list[int]
    example_id: str
    group_id: str
    golds: tuple[str, ...]
    seed: int | None = None
    """own sampling stream: the rollout then does not depend on its batch-mates"""


class RolloutEngine:
    def __init__(
        self,
        model,
        tokenizer,
        retriever: Retriever | None,
        config: RolloutConfig,
        *,
        format_reward: FormatRewardConfig | None = None,
    ) -> None:
        """`retriever` may be None only for single-turn generation (`config.max_turns == 0`),
        where no search is ever executed."""
        config.validate()
        if retriever is None and config.max_turns > 0:
            raise ConfigError(
                f"rollout.max_turns={config.max_turns} executes searches and needs a retriever; "
                "use max_turns=0 for single-turn generation without one"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.retriever = retriever
        self.config = config
        self.format_reward = format_reward
        self.stop = StopChecker(tokenizer)
        self.eos_ids = eos_token_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else next(iter(self.eos_ids), 0)
        self.stats = {"prefill_tokens": 0, "decode_tokens": 0, "forward_calls": 0}

    # ------------------------------------------------------------------ public
    @torch.no_grad()
    def generate(
        self, requests: Sequence[RolloutRequest], *, generator: torch.Generator | None = None
    ) -> RolloutBatch:
        """Run every request to the end and return the padded batch (same order as requests)."""
        was_training = self.model.training
        self.model.eval()
        try:
            episodes: list[Episode] = []
            step = self.config.max_rows
            for s in range(0, len(requests), step):
                episodes.extend(self._run_chunk(list(requests[s : s + step]), generator))
        finally:
            self.model.train(was_training)
        return RolloutBatch.from_episodes(episodes, self.pad_id)

    # ------------------------------------------------------------------ internals
    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _forward(self, feed: list[list[int]], cache, cache_mask: Tensor | None):
        """Left-pad `feed` rows, run them after `cache`, return last-position logits."""
        device = self._device()
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

    def _prefill(self, pending: list[list[int]], cache, cache_mask: Tensor | None):
        """`_forward` for a turn's new context; without a cache yet, rows with the same prompt
        (a GRPO group) share one prefill whose keys/values are then copied out to every row."""
        if cache is None:
            distinct: dict[tuple[int, ...], int] = {}
            inverse = [distinct.setdefault(tuple(f), len(distinct)) for f in pending]
            if len(distinct) < len(pending):
                self.stats["prefill_tokens"] += sum(len(f) for f in distinct)
                logits, cache, mask = self._forward([list(f) for f in distinct], None, None)
                idx = torch.tensor(inverse, device=logits.device)
                cache.batch_select_indices(idx)
                return logits[idx], cache, mask[idx]
        self.stats["prefill_tokens"] += sum(len(f) for f in pending)
        return self._forward(pending, cache, cache_mask)

    def _run_chunk(
        self, requests: list[RolloutRequest], generator: torch.Generator | None
    ) -> list[Episode]:
        cfg = self.config
        eos_cols = torch.tensor(sorted(self.eos_ids), dtype=torch.long, device=self._device())
        policy_temp = cfg.temperature if cfg.temperature > 0 else 1.0  # as the trainer scores
        eps = [
            Episode(
                prompt_ids=list(r.prompt_ids),
                example_id=r.example_id,
                group_id=r.group_id,
                golds=tuple(r.golds),
            )
            for r in requests
        ]
        live = list(range(len(eps)))  # episode index of each batch row
        row_gens = self._row_generators(requests)
        pending: list[list[int]] = [list(e.prompt_ids) for e in eps]  # not yet in the cache
        cache, cache_mask = None, None

        for turn in range(cfg.max_turns + 1):
            final_turn = turn == cfg.max_turns
            if not cfg.kv_reuse:  # re-prefill the whole context every turn (the baseline)
                cache, cache_mask = None, None
                pending = [eps[i].prompt_ids + eps[i].response_ids for i in live]
            budgets = [
                min(
                    cfg.max_turn_tokens,
                    cfg.max_total_tokens - len(eps[i].prompt_ids) - len(eps[i].response_ids),
                )
                for i in live
            ]
            logits, cache, cache_mask = self._prefill(pending, cache, cache_mask)
            turn_ids: list[list[int]] = [[] for _ in live]
            turn_lp: list[list[float]] = [[] for _ in live]
            turn_ent: list[list[float]] = [[] for _ in live]
            active = [b > 0 for b in budgets]
            out_of_budget = [False] * len(live)  # the turn ran into its budget, not ended itself
            while any(active):
                # sample only rows still in their turn: a stopped row must not consume randomness
                act = [r for r in range(len(live)) if active[r]]
                policy = logits[act]
                scores = policy
                if cfg.min_turn_tokens:
                    young = [k for k, r in enumerate(act) if len(turn_ids[r]) < cfg.min_turn_tokens]
                    if young and self.eos_ids:
                        rows = torch.tensor(young, device=scores.device)[:, None]
                        scores = scores.clone()
                        scores[rows, eos_cols] = float("-inf")
                picked_t = sample_next_token(
                    scores,
                    temperature=cfg.temperature,
                    top_k=cfg.top_k,
                    top_p=cfg.top_p,
                    generator=generator,
                    row_generators=None if row_gens is None else [row_gens[live[r]] for r in act],
                )
                # pi_old of the sampled tokens, from the logits we already have: the policy's own
                # distribution (unfiltered, unmasked), at the trainer's temperature
                lp, ent = token_log_probs_and_entropy(
                    policy, picked_t.to(policy.device), temperature=policy_temp
                )
                picked = picked_t.tolist()
                tokens: list[int | None] = [None] * len(live)
                for r, tok_id, p, h in zip(act, picked, lp.tolist(), ent.tolist(), strict=True):
                    tokens[r] = tok_id
                    turn_lp[r].append(p)
                    turn_ent[r].append(h)
                feed: list[int | None] = []
                for row, tok in enumerate(tokens):
                    if tok is None:
                        feed.append(None)
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
                    feed.append(tok if active[row] else None)
                if any(active):
                    self.stats["decode_tokens"] += sum(f is not None for f in feed)
                    logits, cache, cache_mask = self._decode_step(feed, cache, cache_mask)
            pending = [[ids[-1]] if ids else [] for ids in turn_ids]

            queries: list[tuple[int, str]] = []
            keep: list[int] = []
            next_pending: list[list[int]] = []
            for row, ep_index in enumerate(live):
                ep = eps[ep_index]
                ids = turn_ids[row]
                if not ids:  # no room was left for this turn (budget 0): it never happened
                    ep.stop_reason = "context_limit"
                    ep.context_capped = True
                    continue
                ep.append(ids, action=True, logprobs=turn_lp[row], entropies=turn_ent[row])
                text = self.tokenizer.decode(ids, skip_special_tokens=False)
                ep.action_texts.append(text)
                ep.num_turns += 1
                if out_of_budget[row] and budgets[row] < cfg.max_turn_tokens:
                    ep.context_capped = True  # cut by the total cap, not the per-turn cap
                room = cfg.max_total_tokens - len(ep.prompt_ids) - len(ep.response_ids)
                # parsed whatever ended the turn (stop tag, EOS, budget): Search-R1's rule
                action = parse_action(text)
                if action.kind == "answer":
                    ep.stop_reason = "answer"
                    continue
                if final_turn or room <= 0:
                    ep.stop_reason = "context_limit" if room <= 0 else "turn_limit"
                    ep.context_capped = ep.context_capped or room <= 0
                    continue
                keep.append(row)
                if action.kind == "search":
                    queries.append((row, action.content))
                    next_pending.append(None)  # filled after the retriever call
                else:
                    ep.num_invalid += 1
                    next_pending.append(self._observation(ep, invalid_action_message(), room))

            if queries:
                results = self.retriever.search([q for _, q in queries], cfg.topk)
                by_row = {row: (q, hits) for (row, q), hits in zip(queries, results, strict=True)}
                for j, row in enumerate(keep):
                    if row in by_row:
                        ep = eps[live[row]]
                        q, hits = by_row[row]
                        ep.num_valid_searches += 1
                        ep.queries.append(q)
                        ep.retrieved_ids.append([h.id for h in hits])
                        ep.retrieved_texts.extend(h.contents for h in hits)
                        room = cfg.max_total_tokens - len(ep.prompt_ids) - len(ep.response_ids)
                        block = information_block(
                            hits, tokenizer=self.tokenizer, max_tokens=cfg.max_obs_tokens
                        )
                        next_pending[j] = self._observation(ep, block, room)

            if not keep:
                live = []
                break
            # rows that go on: unfed stop token + observation; drop finished rows from the cache
            pending = [pending[row] + obs for row, obs in zip(keep, next_pending, strict=True)]
            if cache is not None and len(keep) < len(live):
                cache.batch_select_indices(torch.tensor(keep, device=cache_mask.device))
                cache_mask = cache_mask[keep]
            live = [live[row] for row in keep]

        for ep in eps:
            self._finish(ep)
        return eps

    def _row_generators(self, requests: list[RolloutRequest]) -> list[torch.Generator] | None:
        seeds = [r.seed for r in requests]
        if all(s is None for s in seeds):
            return None
        if any(s is None for s in seeds):
            raise ValueError("either every RolloutRequest has a seed or none has")
        device = self._device()
        gen_device = device if device.type == "cuda" else torch.device("cpu")
        return [torch.Generator(device=gen_device).manual_seed(int(s)) for s in seeds]

    def _decode_step(self, feed: list[int | None], cache, cache_mask: Tensor):
        """Feed one token per row; rows that stopped get a masked pad so shapes stay aligned."""
        return self._forward([[] if f is None else [f] for f in feed], cache, cache_mask)

    def _observation(self, ep: Episode, text: str, room: int) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > room:  # truncated by the total context cap
            ids = ids[: max(room, 0)]
            ep.context_capped = True
        ep.append(ids, action=False)
        return ids

    def _finish(self, ep: Episode) -> None:
        ep.response_text = self.tokenizer.decode(ep.response_ids, skip_special_tokens=False)
        # only the final answer action counts: the answer span of the last turn, when that turn
        # is an answer; an <answer> stitched across turns and observations is no answer
        answer = final_answer(ep.action_texts) if ep.stop_reason == "answer" else None
        # the tag-sequence check (valid_format, format reward) reads the observations too
        result = score_answer(
            answer,
            ep.golds,
            response_text=ep.response_text,
            format_config=self.format_reward,
            retrieved_texts=ep.retrieved_texts,
        )
        ep.answer = result.answer
        ep.reward, ep.em, ep.f1, ep.sub_em = result.reward, result.em, result.f1, result.sub_em
        ep.valid_format = result.valid_format
        mark_answer_span(ep, self.tokenizer)  # a no-op unless stop_reason == "answer"
