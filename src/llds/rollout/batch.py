"""The tensors and per-row facts one rollout batch hands to the trainer and the diagnostics."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from llds.algo.segments import action_segments


@dataclass
class Episode:
    """One finished multi-turn rollout, kept as the exact token ids the model sampled."""

    prompt_ids: list[int]
    example_id: str
    group_id: str
    golds: tuple[str, ...]
    response_ids: list[int] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)  # 1 = model-written token
    answer_mask: list[int] = field(default_factory=list)  # 1 = final <answer>...</answer> span
    action_texts: list[str] = field(default_factory=list)
    response_text: str = ""
    answer: str | None = None
    reward: float = 0.0
    em: float = 0.0
    f1: float = 0.0
    sub_em: float = 0.0
    valid_format: bool = False
    num_turns: int = 0
    num_valid_searches: int = 0
    num_invalid: int = 0
    queries: list[str] = field(default_factory=list)
    retrieved_ids: list[list[str]] = field(default_factory=list)
    retrieved_texts: list[str] = field(default_factory=list)
    stop_reason: str = ""
    """why the rollout ended: "answer" (the last turn's action is an answer), "context_limit"
    (no room left under `rollout.max_total_tokens` after a turn that was not an answer, or after
    its observation; this wins over "turn_limit") or "turn_limit" (the last allowed turn,
    `rollout.max_turns + 1`, was not an answer). An end-of-sequence token ends only the turn,
    never the rollout by itself, so there is no "eos" reason."""
    context_capped: bool = False
    """`rollout.max_total_tokens` cut this rollout short: a turn ran out of tokens at a budget
    smaller than `rollout.max_turn_tokens` because only that much context was left (it had not
    ended by end-of-sequence or a stop tag), or an observation was truncated to the room left,
    or the rollout ended with stop_reason "context_limit". A rollout that fits, even exactly
    (say an answer whose closing tag is the last token that fits), is not capped."""
    metadata: dict[str, Any] = field(default_factory=dict)
    logprobs: list[float] | None = field(default_factory=list)
    """log pi(token) of each response token under the sampling model (0 for observations);
    None once an action was appended without them"""
    entropies: list[float] | None = field(default_factory=list)
    """entropy of the sampling model's next-token distribution at each response token"""

    def append(
        self,
        ids: list[int],
        *,
        action: bool,
        logprobs: list[float] | None = None,
        entropies: list[float] | None = None,
    ) -> None:
        self.response_ids.extend(ids)
        self.action_mask.extend([int(action)] * len(ids))
        self.answer_mask.extend([0] * len(ids))
        if action and (logprobs is None or entropies is None):
            self.logprobs = self.entropies = None  # unknown from here on: the trainer recomputes
        if self.logprobs is not None and self.entropies is not None:
            self.logprobs.extend(logprobs if action else [0.0] * len(ids))
            self.entropies.extend(entropies if action else [0.0] * len(ids))


@dataclass
class RolloutBatch:
    """A padded batch: prompts left-padded to `prompt_len`, responses right-padded after it.

    Every response starts at column `prompt_len`, so the trainer computes logits only for the
    response columns. Per-token masks are `[B, R]` over the response columns.
    """

    input_ids: Tensor  # [B, P + R]
    attention_mask: Tensor  # [B, P + R]
    prompt_len: int
    loss_mask: Tensor  # [B, R] model-written tokens
    answer_mask: Tensor  # [B, R]
    action_index: Tensor  # [B, R], -1 outside actions
    rewards: Tensor  # [B]
    group_ids: list[str]
    episodes: list[Episode]
    rollout_logprobs: Tensor | None = None
    """[B, R] float32 log pi(token) computed by the sampling forward passes themselves (0 on
    observation and padding columns); lets the trainer skip recomputing pi_old. None when any
    episode lacks them."""
    rollout_entropy: Tensor | None = None  # [B, R] float32, alongside rollout_logprobs

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def response_len(self) -> int:
        return self.input_ids.shape[1] - self.prompt_len

    @property
    def response_ids(self) -> Tensor:
        return self.input_ids[:, self.prompt_len :]

    def select(self, rows: list[int] | Tensor) -> RolloutBatch:
        """Sub-batch of `rows`, with all-padding columns on both ends trimmed away."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        am = self.attention_mask[idx]
        p = self.prompt_len
        prompt_cols = am[:, :p].any(0).nonzero()
        first = int(prompt_cols[0]) if len(prompt_cols) else p
        resp_cols = am[:, p:].any(0).nonzero()
        last = int(resp_cols[-1]) + 1 if len(resp_cols) else 0
        return RolloutBatch(
            input_ids=self.input_ids[idx][:, first : p + last],
            attention_mask=am[:, first : p + last],
            prompt_len=p - first,
            loss_mask=self.loss_mask[idx][:, :last],
            answer_mask=self.answer_mask[idx][:, :last],
            action_index=self.action_index[idx][:, :last],
            rewards=self.rewards[idx],
            group_ids=[self.group_ids[i] for i in idx.tolist()],
            episodes=[self.episodes[i] for i in idx.tolist()],
            rollout_logprobs=None
            if self.rollout_logprobs is None
            else self.rollout_logprobs[idx][:, :last],
            rollout_entropy=None
            if self.rollout_entropy is None
            else self.rollout_entropy[idx][:, :last],
        )

    def responses(self) -> RolloutBatch:
        """The responses as a batch of their own, without the prompt columns: what a pass sees
        that takes each prompt as context computed once elsewhere (its micro-batches are packed
        by response length, `llds.policy.prompt_once`)."""
        p = self.prompt_len
        return dataclasses.replace(
            self,
            input_ids=self.input_ids[:, p:],
            attention_mask=self.attention_mask[:, p:],
            prompt_len=0,
        )

    @classmethod
    def from_episodes(cls, episodes: list[Episode], pad_id: int) -> RolloutBatch:
        b = len(episodes)
        p = max(len(e.prompt_ids) for e in episodes)
        r = max(1, max(len(e.response_ids) for e in episodes))
        ids = torch.full((b, p + r), pad_id, dtype=torch.long)
        attn = torch.zeros((b, p + r), dtype=torch.long)
        loss = torch.zeros((b, r), dtype=torch.bool)
        ans = torch.zeros((b, r), dtype=torch.bool)
        known = all(
            e.logprobs is not None
            and e.entropies is not None
            and len(e.logprobs) == len(e.entropies) == len(e.response_ids)
            for e in episodes
        )
        logp = torch.zeros((b, r), dtype=torch.float32) if known else None
        ent = torch.zeros((b, r), dtype=torch.float32) if known else None
        for i, e in enumerate(episodes):
            n_p, n_r = len(e.prompt_ids), len(e.response_ids)
            ids[i, p - n_p : p] = torch.tensor(e.prompt_ids, dtype=torch.long)
            attn[i, p - n_p : p + n_r] = 1
            if n_r:
                ids[i, p : p + n_r] = torch.tensor(e.response_ids, dtype=torch.long)
                loss[i, :n_r] = torch.tensor(e.action_mask, dtype=torch.bool)
                ans[i, :n_r] = torch.tensor(e.answer_mask, dtype=torch.bool)
                if logp is not None and ent is not None:
                    logp[i, :n_r] = torch.tensor(e.logprobs, dtype=torch.float32)
                    ent[i, :n_r] = torch.tensor(e.entropies, dtype=torch.float32)
        action_index, _ = action_segments(loss)
        return cls(
            input_ids=ids,
            attention_mask=attn,
            prompt_len=p,
            loss_mask=loss,
            answer_mask=ans,
            action_index=action_index,
            rewards=torch.tensor([e.reward for e in episodes], dtype=torch.float32),
            group_ids=[e.group_id for e in episodes],
            episodes=episodes,
            rollout_logprobs=logp,
            rollout_entropy=ent,
        )
