"""Batched multi-turn rollouts of a Hugging Face causal LM against a search environment.

All live episodes of a chunk decode together. A turn ends per row at the first closing
`</search>` / `</answer>`, an end-of-sequence token, or its token budget (the per-turn cap, or
less when the total context cap leaves less room). Whatever ended it, the turn is then parsed
as an action (`llds.env.transition.step`, Search-R1's rule): an answer ends the rollout; a
complete search is executed; a turn with no complete search/answer span is an invalid action
that gets the corrective message as its observation, and the rollout goes on while turns and
context remain. All searches of the turn go to the retriever in one call; observations are
appended as tokens; finished rows leave the batch.

Two decode loops produce the turns (`rollout.cache`): the device-resident loop over a static
key/value cache (`static_loop`, Llama-family models) and the eager loop over transformers' own
cache (`dynamic_loop`, any model). With a seed per request both sample the same tokens: the
noise is a function of (seed, position, token), `llds.rollout.noise`.

The ids the model sampled are kept verbatim (an end-of-sequence token that ended a turn too):
nothing is decoded and re-tokenized. The reward and the LLDS-MA answer mask read only the final
answer action, the answer span of the last turn when that turn is an answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from llds.env.observation import information_block, invalid_action_message
from llds.env.rewards import FormatRewardConfig, final_answer, score_answer
from llds.env.transition import step as env_step
from llds.errors import ConfigError
from llds.models.static_decoder import StaticDecoder, static_decode_unsupported
from llds.retrieval.base import Retriever
from llds.rollout.batch import Episode, RolloutBatch
from llds.rollout.chunk_rows import chunk_rows
from llds.rollout.config import RolloutConfig
from llds.rollout.dynamic_loop import DynamicSession
from llds.rollout.spans import mark_answer_span
from llds.rollout.static_loop import StaticSession
from llds.rollout.stopping import StopChecker, eos_token_ids
from llds.rollout.turn_tokens import TurnTokens, stop_candidates


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
        self.cache = self._cache_kind()
        device = self._device()
        self.check_every = 1 if device.type == "cpu" else 16
        """tokens between the host's looks at a static loop (1 on a CPU, where a look is free)"""
        self.compact = device.type == "cpu"
        """static loop: finished rows leave the computed rows (fewer rows to compute, on a CPU)
        rather than being masked (fixed shapes for a compiled step, and on a GPU)"""
        self.compile = self.cache == "static" and (
            device.type == "cuda" if self.config.compile == "auto" else self.config.compile
        )
        """`rollout.compile`; `auto`: on a GPU (CUDA graphs), not on a CPU"""
        self._candidates = None
        self._decoder: StaticDecoder | None = None
        self._compile_seconds_before = 0.0  # of decoders replaced by a larger one
        self.stats = {"prefill_tokens": 0, "decode_tokens": 0, "forward_calls": 0}

    def _cache_kind(self) -> str:
        """The decode loop `rollout.cache` asks for; `auto`: static where it serves."""
        cfg = self.config
        reason = static_decode_unsupported(self.model)
        if cfg.cache == "dynamic":
            return "dynamic"
        if cfg.cache == "static":
            if reason is not None:
                raise ConfigError(f"rollout.cache=static does not serve this model: {reason}")
            if not cfg.kv_reuse:
                raise ConfigError("rollout.cache=static keeps the cache: it needs kv_reuse=true")
            return "static"
        eager_only = not cfg.kv_reuse or cfg.attn_implementation is not None
        return "static" if reason is None and not eager_only else "dynamic"

    # ------------------------------------------------------------------ public
    @property
    def compile_seconds(self) -> float:
        """Seconds the rollouts so far spent compiling the decode step (0 when not compiled):
        a one-time cost, paid again only for a new shape."""
        own = self._decoder.compile_seconds if self._decoder is not None else 0.0
        return self._compile_seconds_before + own

    @torch.no_grad()
    def generate(
        self, requests: Sequence[RolloutRequest], *, generator: torch.Generator | None = None
    ) -> RolloutBatch:
        """Run every request to the end and return the padded batch (same order as requests)."""
        was_training = self.model.training
        self.model.eval()
        try:
            episodes: list[Episode] = []
            cfg = self.config
            step = chunk_rows(
                self.model, cfg.max_total_tokens + 1, cfg.max_rows, cfg.cache_memory_mb
            )
            for s in range(0, len(requests), step):
                episodes.extend(self._run_chunk(list(requests[s : s + step]), generator))
        finally:
            self.model.train(was_training)
        return RolloutBatch.from_episodes(episodes, self.pad_id)

    # ------------------------------------------------------------------ internals
    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _seeds(self, requests: list[RolloutRequest], generator: torch.Generator | None):
        """Per-row sampling seeds: the requests' own, else drawn from `generator` (or the
        global stream) once per chunk; both loops then sample the same tokens."""
        seeds = [r.seed for r in requests]
        if any(s is None for s in seeds) and not all(s is None for s in seeds):
            raise ValueError("either every RolloutRequest has a seed or none has")
        if seeds[0] is None:
            if self.config.temperature == 0:  # greedy: no noise is drawn, no stream consumed
                return torch.zeros(len(seeds), dtype=torch.long, device=self._device())
            drawn = torch.randint(0, 1 << 62, (len(seeds),), generator=generator)
            return drawn.to(self._device())
        return torch.tensor(seeds, dtype=torch.long, device=self._device())

    def _session(self, requests: list[RolloutRequest], generator: torch.Generator | None):
        """The decode loop of one chunk: its prompts prefilled, ready for the first turn."""
        prompts = [r.prompt_ids for r in requests]
        shared = {
            "eos_ids": self.eos_ids,
            "stop": self.stop,
            "pad_id": self.pad_id,
            "stats": self.stats,
        }
        seeds = self._seeds(requests, generator)
        if self.cache == "dynamic":
            return DynamicSession(self.model, self.config, prompts, seeds, **shared)
        if self._candidates is None:
            vocab = int(self.model.get_output_embeddings().weight.shape[0])
            self._candidates = stop_candidates(
                self.tokenizer, self.stop.stop_strings, vocab, self._device()
            )
        if self._decoder is None or self._decoder.rows < len(prompts):
            if self._decoder is not None:
                self._compile_seconds_before += self._decoder.compile_seconds
            capacity = self.config.max_total_tokens + 1
            self._decoder = StaticDecoder(self.model, len(prompts), capacity, compile=self.compile)
        return StaticSession(
            self._decoder,
            self.config,
            prompts,
            seeds,
            candidates=self._candidates,
            check_every=self.check_every,
            compact=self.compact,
            **shared,
        )

    def _run_chunk(
        self, requests: list[RolloutRequest], generator: torch.Generator | None
    ) -> list[Episode]:
        cfg = self.config
        eps = [
            Episode(
                prompt_ids=list(r.prompt_ids),
                example_id=r.example_id,
                group_id=r.group_id,
                golds=tuple(r.golds),
            )
            for r in requests
        ]
        live = list(range(len(eps)))  # episode index of each live row
        session = self._session(requests, generator)
        for turn in range(cfg.max_turns + 1):
            budgets = [
                min(cfg.max_turn_tokens, cfg.max_total_tokens - self._used(eps[i])) for i in live
            ]
            turns = session.decode_turn(budgets)
            keep, searches, observations = self._apply_turns(
                [eps[i] for i in live], turns, budgets, final_turn=turn == cfg.max_turns
            )
            if searches:
                self._search([eps[live[row]] for row in keep], searches, observations)
            if not keep:
                break
            session.advance(keep, turns, observations)
            live = [live[row] for row in keep]
        for ep in eps:
            self._finish(ep)
        return eps

    @staticmethod
    def _used(ep: Episode) -> int:
        return len(ep.prompt_ids) + len(ep.response_ids)

    def _apply_turns(
        self,
        live_eps: list[Episode],
        turns: list[TurnTokens],
        budgets: list[int],
        *,
        final_turn: bool,
    ) -> tuple[list[int], list[tuple[int, str]], list[list[int] | None]]:
        """Append each row's turn and take its transition. Returns the rows that go on, the
        searches to run (index into those rows, query) and the rows' observations so far
        (None where a search result is still to come)."""
        cfg = self.config
        keep: list[int] = []
        searches: list[tuple[int, str]] = []
        observations: list[list[int] | None] = []
        for row, (ep, turn) in enumerate(zip(live_eps, turns, strict=True)):
            if not turn.ids:  # no room was left for this turn (budget 0): it never happened
                ep.stop_reason = "context_limit"
                ep.context_capped = True
                continue
            ep.append(turn.ids, action=True, logprobs=turn.logprobs, entropies=turn.entropies)
            text = self.tokenizer.decode(turn.ids, skip_special_tokens=False)
            ep.action_texts.append(text)
            ep.num_turns += 1
            if turn.out_of_budget and budgets[row] < cfg.max_turn_tokens:
                ep.context_capped = True  # cut by the total cap, not the per-turn cap
            move = env_step(
                text,
                used_tokens=self._used(ep),
                max_total_tokens=cfg.max_total_tokens,
                final_turn=final_turn,
            )
            if move.done:
                ep.stop_reason = move.stop_reason or ""
                ep.context_capped = ep.context_capped or move.context_capped
                continue
            if move.action.kind == "search":
                searches.append((len(keep), move.action.content))
                observations.append(None)  # filled after the retriever call
            else:
                ep.num_invalid += 1
                observations.append(self._observation(ep, invalid_action_message(), move.room))
            keep.append(row)
        return keep, searches, observations

    def _search(
        self,
        kept_eps: list[Episode],
        searches: list[tuple[int, str]],
        observations: list[list[int] | None],
    ) -> None:
        """Run the turn's searches in one retriever call; fill in their observations."""
        cfg = self.config
        results = self.retriever.search([q for _, q in searches], cfg.topk)
        for (j, query), hits in zip(searches, results, strict=True):
            ep = kept_eps[j]
            ep.num_valid_searches += 1
            ep.queries.append(query)
            ep.retrieved_ids.append([h.id for h in hits])
            ep.retrieved_texts.extend(h.contents for h in hits)
            room = cfg.max_total_tokens - self._used(ep)
            block = information_block(hits, tokenizer=self.tokenizer, max_tokens=cfg.max_obs_tokens)
            observations[j] = self._observation(ep, block, room)

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
