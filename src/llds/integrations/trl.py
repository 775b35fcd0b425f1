"""LLDS and multi-turn search rollouts for TRL's `GRPOTrainer` (trl >= 1.16).

Three pieces, usable separately:

- `LLDSGRPOTrainer` + `LLDSGRPOConfig`: TRL's own GRPO loss plus `llds_coef * L_LLDS`, computed
  from the tensors TRL already has: its per-token log-probs of the current policy, its
  `old_per_token_logps`, its advantages and its loss mask (`completion_mask * tool_mask`, so
  observation tokens are excluded and the action gate sees the right segments). LLDS statistics
  (`llds/*`) and Lazy Likelihood Displacement metrics (`lld/*`) go to TRL's metrics.
- `search_rollout_func(retriever)`: plugs the project's multi-turn search rollout engine into
  TRL's (experimental) `rollout_func`, returning token ids, the environment mask (`env_mask`)
  and per-rollout facts that reward functions receive as keyword arguments.
- `search_r1_reward(...)`: a TRL reward function scoring the last `<answer>` of each rollout
  against the dataset's gold answers (EM by default, optional format-aware reward).

When does LLDS act? TRL recomputes `old_per_token_logps` only when a generation batch is used
for more than one optimizer step (`num_iterations > 1`, or `steps_per_generation` larger than
`gradient_accumulation_steps`); otherwise old == current and `d = 0`, so LLDS never acts. The
trainer warns in that case (`llds_can_act`).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor
from trl import GRPOConfig, GRPOTrainer

from llds.algo import LLDSConfig, action_segments, llds_term
from llds.algo.llds_in_force import LLDSInForce, llds_in_force
from llds.config.algo import Gate, LLDSAggregation, engine_fields, from_engine
from llds.env.rewards import FormatRewardConfig, compute_reward, score_answer
from llds.errors import ConfigError, DataFormatError
from llds.metrics import VALID_SEARCHES
from llds.monitor.framework_logs import TRL_NAMES, LoggedMonitor
from llds.monitor.likelihood import (
    displacement_metrics,
    likelihood_metrics,
    lld_share_metrics,
    pool_shares,
)
from llds.monitor.mismatch import correction_metrics, mismatch_metrics
from llds.monitor.replay import load_monitor_config
from llds.monitor.settings import MonitorConfig
from llds.monitor.turns import turn_metrics, void_turn_count
from llds.retrieval.base import Retriever
from llds.rollout import RolloutConfig, RolloutEngine, RolloutRequest
from llds.rollout.batch import Episode
from llds.train.rollback import decide

log = logging.getLogger(__name__)

INACTIVE_WARNING = (
    "LLDS is enabled (llds_coef > 0) but every generation batch gets exactly one optimizer step "
    "(gradient_accumulation_steps={ga} is a multiple of steps_per_generation x num_iterations = "
    "{spg} x {it}): TRL then uses old log-probs == current log-probs, so d = 0 and LLDS can never "
    "act. Set num_iterations > 1, or steps_per_generation > gradient_accumulation_steps (e.g. "
    "gradient_accumulation_steps=1, steps_per_generation=4), so that later optimizer steps on the "
    "same rollouts see a moved policy (the paper takes several optimizer steps per rollout batch)."
)

# Keys the trainer adds to TRL's per-batch input dict (shuffled and split along with TRL's own).
REWARD_KEY = "llds_reward"
SEARCHES_KEY = "llds_num_searches"
ANSWER_MASK_KEY = "llds_answer_mask"
ANSWER_WEIGHT_KEY = "llds_answer_weight"
GENERATED_AT_KEY = "llds_generated_at_step"  # optimizer steps taken when pi_old was computed
GROUP_KEY = "llds_group"  # the row's group (prompt) index in the generation batch
GROUP_ACC_KEY = "llds_group_accuracy"  # share of the row's group with reward >= threshold
PREMB = "lld/premb_"
"""Prefix of the LLD shares TRL's loss can see: its current log-probs (the policy before this
optimizer step) against `old_per_token_logps` (pi_old of the generation batch), pooled over the
logging interval. Not the native post-update pass (docs/integrations.md)."""


def llds_can_act(
    gradient_accumulation_steps: int, steps_per_generation: int, num_iterations: int
) -> bool:
    """True when some optimizer step of a generation batch runs on an already-updated policy.

    TRL generates every `steps_per_generation * num_iterations` micro-steps and steps the optimizer
    every `gradient_accumulation_steps`; when the first divides the second, each generation batch
    is consumed inside a single optimizer step (this is exactly when TRL skips recomputing
    `old_per_token_logps`).
    """
    return gradient_accumulation_steps % (steps_per_generation * num_iterations) != 0


def _llds(name: str) -> Any:
    """The dataclass field of `LLDSConfig.<name>` as TRL's `llds_<name>`: its default and help
    text read from the one definition (`engine_fields`), so they exist once."""
    spec = _ENGINE_FIELDS[f"llds_{name}"]
    return field(default=spec.default, metadata=dict(spec.metadata))


_ENGINE_FIELDS = {name: spec for name, _, spec in engine_fields("llds_")}


@dataclass
class LLDSGRPOConfig(GRPOConfig):
    """`GRPOConfig` plus the LLDS settings as `llds_<field>` (`llds.algo.LLDSConfig`'s fields,
    their defaults and help read from it; a test checks that every field is here with its type),
    and `llds_correct_threshold` / `llds_log_lld_metrics` for the lld/* metrics. `llds_scope`
    other than `minibatch` is refused: TRL's loss sees one mini-batch at a time."""

    llds_enabled: bool = _llds("enabled")
    llds_coef: float = _llds("coef")
    llds_gate: Gate = _llds("gate")
    llds_aggregation: LLDSAggregation = _llds("aggregation")
    llds_mask_answer: bool = _llds("mask_answer")
    llds_answer_weight: float | None = _llds("answer_weight")
    llds_answer_baseline: float = _llds("answer_baseline")
    llds_scope: Literal["minibatch", "batch"] = _llds("scope")
    llds_batch_rows: int = _llds("batch_rows")
    llds_first_update: Literal["zero", "computed"] = _llds("first_update")
    llds_correct_threshold: float = field(
        default=0.5,
        metadata={
            "help": "A rollout counts as correct in the lld/* metrics when its total reward is "
            ">= this (0.5 separates right from wrong for EM and the Search-R1 format reward "
            "with its default scores)."
        },
    )
    llds_log_lld_metrics: bool = field(
        default=True, metadata={"help": "Log lld/* likelihood and displacement metrics."}
    )
    llds_alarms: bool = field(
        default=True,
        metadata={
            "help": "Raise the monitor's collapse alarms on the logged training metrics, as the "
            "native trainer does: each a warning in the log and a line in "
            "OUTPUT_DIR/alarms.jsonl (docs/diagnostics.md)."
        },
    )
    llds_monitor_config: str | None = field(
        default=None,
        metadata={
            "help": "A YAML file whose `monitor:` section sets the alarms (the run config's "
            "section, as `llds train --print-config` shows it); None: the defaults."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        _ = self.llds  # a bad llds_* value fails here, with its name
        _ = self.llds_monitor  # so does a bad `llds_monitor_config`, naming its file and key

    @property
    def llds_monitor(self) -> MonitorConfig:
        """The alarms' settings `llds_monitor_config` names (read from its file)."""
        return load_monitor_config(self.llds_monitor_config)

    @property
    def llds(self) -> LLDSConfig:
        """The LLDS settings these arguments hold, validated by `LLDSConfig`."""
        return from_engine(self)


def loss_mask_from_inputs(inputs: Mapping[str, Any]) -> Tensor:
    """TRL's loss mask: `completion_mask`, times `tool_mask` (0 on tool/environment tokens)."""
    mask = inputs["completion_mask"]
    if inputs.get("tool_mask") is not None:
        mask = mask * inputs["tool_mask"]
    return mask.bool()


def trl_llds_loss(
    per_token_logps: Tensor,
    inputs: Mapping[str, Any],
    args: LLDSGRPOConfig,
    *,
    num_tokens: float | Tensor | None = None,
    moved: bool = True,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The objective's LLDS term (`llds_term`) on the tensors of one TRL micro-batch.

    `per_token_logps` is `[B, C]` log pi_theta of the completion tokens (with gradient) as TRL's
    `_compute_loss` computes it; pi_old is TRL's `old_per_token_logps` when present and LLDS
    acts on this optimizer step (the policy has `moved` since the generation, or
    `first_update: computed`, the authors' behaviour), else the detached current values (then
    d = 0 exactly: LLDS is 0).
    """
    mask = loss_mask_from_inputs(inputs)
    in_force = llds_in_force_of(inputs, args.llds)
    old = inputs.get("old_per_token_logps")
    if old is None or not in_force.acts(first_update=not moved):
        old = per_token_logps.detach()
    answer_mask = inputs.get(ANSWER_MASK_KEY) if in_force.masks_answer else None
    return llds_term(
        per_token_logps,
        old,
        inputs["advantages"],
        mask,
        in_force.settings,
        answer_mask=answer_mask,
        answer_weight=in_force.answer_weight,
        num_tokens=num_tokens,
    )


def llds_in_force_of(inputs: Mapping[str, Any], settings: LLDSConfig) -> LLDSInForce:
    """The LLDS a TRL micro-batch applies (`llds.algo.llds_in_force`, as in the native
    trainer): LLDS-MA's beta is the generation batch's, carried in its inputs
    (`answer_weight_for` of its searches), else the schedule's without known searches."""
    given = inputs.get(ANSWER_WEIGHT_KEY)
    if LLDSInForce(settings).masks_answer and given is not None and given.numel():
        return LLDSInForce(settings, float(given.reshape(-1)[0]))
    return llds_in_force(settings)


class LLDSGRPOTrainer(GRPOTrainer):
    """TRL's `GRPOTrainer` with the LLDS regularizer and LLD diagnostics.

    The GRPO loss is TRL's, untouched; LLDS is added to it. The log-probs with gradient are the
    ones TRL's `_compute_loss` computes (captured, not recomputed), so the regularizer costs no
    extra forward pass. Use `LLDSGRPOConfig` (a `GRPOConfig` with `llds_*` fields); a plain
    `GRPOConfig` gets the LLDS defaults.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, LLDSGRPOConfig):
            raise ConfigError(
                "LLDSGRPOTrainer needs args=LLDSGRPOConfig(...) (a GRPOConfig with llds_* fields)"
            )
        self._llds_capture: list[Tensor] | None = None
        self._llds_extra: dict[str, Any] = {}
        self._llds_rewards: Tensor | None = None
        self._llds_premb: dict[str, list[dict[str, float]]] = {"train": [], "eval": []}
        a = self.args
        self.llds_alarm_monitor = (
            LoggedMonitor(a.llds_monitor, TRL_NAMES) if a.llds_alarms else None
        )
        """the collapse alarms on the logged training metrics (None: `llds_alarms=False`)"""
        if a.llds.active_coef > 0 and not llds_can_act(
            a.gradient_accumulation_steps, a.steps_per_generation, self.num_iterations
        ):
            message = INACTIVE_WARNING.format(
                ga=a.gradient_accumulation_steps, spg=a.steps_per_generation, it=self.num_iterations
            )
            warnings.warn(message, UserWarning, stacklevel=2)
            log.warning(message)

    # ---------------------------------------------------------------- generation side
    def _generate(self, prompts: list) -> tuple:
        out = super()._generate(prompts)
        # TRL returns (prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields,
        # images, tool_images); extra_fields are the rollout_func's fields besides env_mask.
        extra = out[5] if len(out) > 5 and isinstance(out[5], dict) else {}
        self._llds_extra = dict(extra)
        return out

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._llds_rewards = rewards
        return rewards

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._llds_extra, self._llds_rewards = {}, None
        out = super()._generate_and_score_completions(inputs)
        b, width = out["completion_ids"].shape
        device = out["completion_ids"].device
        # per row, so that TRL's shuffling and splitting of the batch carries it along
        out[GENERATED_AT_KEY] = torch.full(
            (b,), self.state.global_step, dtype=torch.long, device=device
        )
        mode = "train" if self.model.training else "eval"
        start = self.accelerator.process_index * b
        group = self.num_generations if mode == "train" else self.num_generations_eval
        out[GROUP_KEY] = (torch.arange(start, start + b, device=device) // group).long()
        if self._llds_rewards is not None:
            per_func = self._llds_rewards.to(device)
            total = (per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)
            out[REWARD_KEY] = total[start : start + b]
            correct = (total >= self.args.llds_correct_threshold).float()
            accuracy = correct.reshape(-1, group).mean(-1).repeat_interleave(group)
            out[GROUP_ACC_KEY] = accuracy[start : start + b]
        for name, value in generation_metrics(out, self._llds_extra).items():
            self._metrics[mode][name].append(value)  # per process, as the lld/* metrics
        extra = self._llds_extra
        if isinstance(extra.get("num_valid_searches"), list):
            out[SEARCHES_KEY] = torch.tensor(
                extra["num_valid_searches"], dtype=torch.long, device=device
            )
        if isinstance(extra.get("answer_mask"), list):
            out[ANSWER_MASK_KEY] = _pad_rows(extra["answer_mask"], width, device)
            settings = self.args.llds
            if settings.mask_answer:
                v = float(out[SEARCHES_KEY].float().mean()) if SEARCHES_KEY in out else 0.0
                beta = settings.answer_weight_for(v)
                out[ANSWER_WEIGHT_KEY] = torch.full((b,), beta, dtype=torch.float32, device=device)
        return out

    # ---------------------------------------------------------------- loss side
    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any):
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._llds_capture is not None:
            self._llds_capture.append(out[0])
        return out

    def _compute_loss(self, model, inputs):
        self._llds_capture = []
        try:
            loss = super()._compute_loss(model, inputs)
            captured = self._llds_capture
        finally:
            self._llds_capture = None
        if len(captured) != 1:
            raise RuntimeError(
                f"expected TRL's loss to compute the policy log-probs once, saw {len(captured)}"
            )
        per_token_logps = captured[0]
        mode = "train" if self.model.training else "eval"
        term, stats = self._llds_term(per_token_logps, inputs, mode)
        self._log_llds(mode, term, stats, per_token_logps, inputs)
        return loss + term

    def _stepped_since_generation(self, inputs: Mapping[str, Any]) -> bool:
        """Whether an optimizer step was taken since pi_old was computed (when unknown, as for
        inputs built by hand, assume it was): on the generation batch's first step pi == pi_old,
        so LLDS acts there only under `first_update: computed` (`LLDSInForce.acts`), and the
        displacement is not measured (0 is not a measurement, and counting a tie as a fall
        would read 100%)."""
        at = inputs.get(GENERATED_AT_KEY)
        return at is None or self.state.global_step > int(at.reshape(-1)[0])

    def _llds_term(
        self, per_token_logps: Tensor, inputs: Mapping[str, Any], mode: str
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The LLDS term scaled for gradient accumulation the way TRL scales its own losses."""
        a = self.args
        moved = self._stepped_since_generation(inputs)
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
        if a.llds.aggregation == "token-mean":
            # Same normalizer as TRL's 'dapo' loss: model tokens of one accumulation window.
            tokens = inputs["num_items_in_batch"] / self.accelerator.num_processes
            if mode == "train":
                tokens = tokens * accumulation / a.steps_per_generation
            term, stats = trl_llds_loss(per_token_logps, inputs, a, num_tokens=tokens, moved=moved)
            return term, stats
        term, stats = trl_llds_loss(per_token_logps, inputs, a, moved=moved)
        return term / accumulation, stats

    def _log_llds(
        self,
        mode: str,
        term: Tensor,
        stats: Mapping[str, Tensor],
        per_token_logps: Tensor,
        inputs: Mapping[str, Any],
    ) -> None:
        metrics = self._metrics[mode]
        first_update = not self._stepped_since_generation(inputs)
        acts = inputs.get("old_per_token_logps") is not None and LLDSInForce(self.args.llds).acts(
            first_update
        )
        local = {k: v.detach().float() for k, v in stats.items()}
        local["llds/active"] = torch.tensor(float(acts), device=per_token_logps.device)
        for name in sorted(local):  # same order on every rank: gather is collective
            gathered = self.accelerator.gather(local[name].reshape(1).to(per_token_logps.device))
            metrics[name].append(gathered.nanmean().item())
        if not self.args.llds_log_lld_metrics or inputs.get(REWARD_KEY) is None:
            return
        for name, value in lld_metrics_from_inputs(
            per_token_logps.detach(),
            inputs,
            self.args.llds_correct_threshold,
            measured=self._stepped_since_generation(inputs),
        ).items():
            metrics[name].append(value)  # per process; key sets can differ between ranks
        if acts and inputs.get(GROUP_KEY) is not None:
            self._llds_premb[mode].append(premb_share_parts(per_token_logps.detach(), inputs))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's log, with the `lld/premb_*` shares pooled over the logging interval (counts
        summed, not a mean of per-micro-batch shares); then the training metrics it logged (TRL
        adds its averages to `logs`) go to the alarm monitor."""
        mode = "train" if self.model.training else "eval"
        parts, self._llds_premb[mode] = self._llds_premb[mode], []
        for key, value in pool_shares(parts).items() if parts else ():
            self._metrics[mode][PREMB + key.removeprefix("lld/")] = [value]
        super().log(logs, start_time)
        if mode == "train" and self.llds_alarm_monitor is not None:
            alarms = self.llds_alarm_monitor.update(self.state.global_step, logs)
            if alarms:
                out = Path(self.args.output_dir)
                decide(alarms, "warn", out, write=self.accelerator.is_main_process)


def premb_share_parts(per_token_logps: Tensor, inputs: Mapping[str, Any]) -> dict[str, float]:
    """The monitor's LLD shares on one TRL micro-batch: `old_per_token_logps` (pi_old) against
    the current log-probs, i.e. the updates of the generation batch's earlier optimizer steps
    (not this step's own), with group accuracy from the whole generation batch."""
    mask = loss_mask_from_inputs(inputs)
    groups = [str(int(g)) for g in inputs[GROUP_KEY].reshape(-1).tolist()]
    accuracy = dict(zip(groups, inputs[GROUP_ACC_KEY].reshape(-1).tolist(), strict=True))
    return lld_share_metrics(
        inputs["old_per_token_logps"],
        per_token_logps,
        mask,
        inputs["advantages"].reshape(mask.shape[0], -1)[:, 0],
        groups,
        inputs[REWARD_KEY],
        group_accuracy=accuracy,
    )


def generation_metrics(out: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, float]:
    """The monitor's metrics of one generation batch (this process's rows): turns from the
    rollout function's fields, and sampler-vs-trained mismatch when TRL has sampling log-probs
    (vLLM) besides its recomputed `old_per_token_logps`, with its importance-sampling
    correction when that is on. Keys whose inputs TRL did not give are absent."""
    found: dict[str, float] = {}
    turns = extra.get("num_turns")
    if isinstance(turns, list):
        zeros = [0] * len(turns)
        void = extra.get("num_void_turns") or zeros
        searches = extra.get("num_valid_searches")
        found.update(turn_metrics(turns, list(void), list(searches or zeros)))
        if isinstance(searches, list) and searches:  # what the search-decline rule reads
            found[VALID_SEARCHES] = sum(searches) / len(searches)
    sampled, trained = out.get("sampling_per_token_logps"), out.get("old_per_token_logps")
    if sampled is not None and trained is not None:
        mask = loss_mask_from_inputs(out) & ~torch.isnan(sampled)
        found.update(mismatch_metrics(sampled.nan_to_num(), trained, mask))
        ratio = out.get("importance_sampling_ratio")
        if ratio is not None:  # TRL's truncated or masked ratio, [B, T] or per sequence [B, 1]
            diff = ((trained - sampled) * mask).nan_to_num()
            raw = diff.sum(-1, keepdim=True) if ratio.shape[-1] == 1 else diff
            clipped = ~torch.isclose(ratio, raw.exp(), rtol=1e-5, atol=0.0)
            found.update(correction_metrics(ratio.expand_as(mask), clipped.expand_as(mask), mask))
    return found


def lld_metrics_from_inputs(
    per_token_logps: Tensor,
    inputs: Mapping[str, Any],
    correct_threshold: float,
    *,
    measured: bool = True,
) -> dict[str, float]:
    """LLD metrics of one micro-batch: likelihood of correct vs incorrect rollouts under pi_old
    and, once the policy has moved (TRL provided old log-probs and `measured`: an optimizer
    step came after them), their displacement; before that the displacement keys are absent."""
    mask = loss_mask_from_inputs(inputs)
    action_index, _ = action_segments(mask)
    correct = inputs[REWARD_KEY] >= correct_threshold
    searches = inputs.get(SEARCHES_KEY)
    if searches is None:
        searches = torch.zeros(mask.shape[0], dtype=torch.long, device=mask.device)
    old = inputs.get("old_per_token_logps")
    before = per_token_logps if old is None else old
    out = likelihood_metrics(before, mask, action_index, correct, searches)
    if old is not None and measured:
        adv = inputs["advantages"].reshape(mask.shape[0], -1)[:, 0]
        out.update(displacement_metrics(old, per_token_logps, mask, action_index, correct, adv))
    return out


def _pad_rows(rows: Sequence[Sequence[int]], width: int, device: torch.device) -> Tensor:
    out = torch.zeros((len(rows), width), dtype=torch.bool, device=device)
    for i, row in enumerate(rows):
        n = min(len(row), width)
        if n:
            out[i, :n] = torch.tensor(list(row[:n]), dtype=torch.bool, device=device)
    return out


# ------------------------------------------------------------------------- rollout_func


def prompt_token_ids(tokenizer: Any, prompt: str | Sequence[Mapping[str, Any]]) -> list[int]:
    """Token ids of one dataset prompt: raw text, or chat messages (Search-R1's `prompt` column).

    Messages go through the tokenizer's chat template (with the generation prompt); a tokenizer
    without one (base models) gets the messages' contents joined by newlines as raw text.
    """
    if isinstance(prompt, str):
        text, special = prompt, True
    elif isinstance(prompt, Sequence) and all(isinstance(m, Mapping) for m in prompt):
        messages = [dict(m) for m in prompt]
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            special = False
        else:
            text, special = "\n".join(str(m.get("content", "")) for m in messages), True
    else:
        raise DataFormatError(
            f"prompt must be a string or a list of chat messages, got {type(prompt).__name__}"
        )
    ids = list(tokenizer.encode(text, add_special_tokens=special))
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None and len(ids) >= 2 and ids[0] == ids[1] == bos:
        ids = ids[1:]
    return ids


RolloutFunc = Callable[[list, Any], dict[str, Any]]


def search_rollout_func(
    retriever: Retriever,
    config: RolloutConfig | None = None,
    *,
    generator: torch.Generator | None = None,
) -> RolloutFunc:
    """A TRL `rollout_func` running Search-R1 multi-turn rollouts with `RolloutEngine`.

    TRL hands it the per-process prompts, already repeated `num_generations` times (one rollout
    per entry, consecutive entries form a group). It returns:
    `prompt_ids`, `completion_ids` (model turns and observations, the exact sampled ids),
    `logprobs` (the sampler's log-prob of each model token, None on observations: TRL's
    `sampling_per_token_logps`, from which the monitor's `mismatch/*` metrics and, with vLLM,
    TRL's importance-sampling correction are computed), `env_mask` (1 = model token, 0 =
    observation; TRL multiplies it into its loss mask) and, forwarded to reward functions:
    `response_text`, `final_answer` (the content of the last turn's answer action, None when the
    rollout did not end with an answer), `answer_mask`, `num_valid_searches`, `num_turns`,
    `num_invalid` and `num_void_turns` (turns that are neither a search nor an answer, the last
    one included; `LLDSGRPOTrainer` logs them as `turns/*`).

    Generation uses the training model through the project's engine (KV cache kept across turns),
    not vLLM. `config` defaults to `RolloutConfig` with TRL's temperature / top_p / top_k.
    Rewards are computed by a reward function (see `search_r1_reward`), which receives the
    dataset's gold answers.
    """
    state: dict[str, Any] = {"engine": None, "config": None, "calls": 0}

    def rollout(prompts: list, trainer: Any) -> dict[str, Any]:
        tokenizer = trainer.processing_class
        if state["config"] is None:
            state["config"] = config or _config_from_trainer(trainer.args)
        cfg = state["config"]
        training = trainer.model.training
        group = trainer.num_generations if training else trainer.num_generations_eval
        call = state["calls"]
        state["calls"] += 1
        requests = [
            RolloutRequest(
                prompt_ids=prompt_token_ids(tokenizer, p),
                example_id=f"{call}-{i}",
                group_id=f"{call}-{i // max(group, 1)}",
                golds=("",),  # scored by the reward function, which sees the dataset's answers
            )
            for i, p in enumerate(prompts)
        ]
        with _generation_model(trainer) as model:
            engine = state["engine"]
            if engine is None or engine.model is not model or engine.config is not cfg:
                engine = RolloutEngine(model, tokenizer, retriever, cfg)
                state["engine"] = engine
            batch = engine.generate(requests, generator=generator)
        eps = batch.episodes
        completion_ids, env_mask, answer_mask, logprobs = [], [], [], []
        for e in eps:
            ids, mask, ans = list(e.response_ids), list(e.action_mask), list(e.answer_mask)
            logp = sampler_logprobs(e)
            if not ids:  # keep TRL's padding well defined: one masked-out end token
                ids, mask, ans, logp = [engine.pad_id], [0], [0], [None]
            completion_ids.append(ids)
            env_mask.append(mask)
            answer_mask.append(ans)
            logprobs.append(logp)
        return {
            "prompt_ids": [list(e.prompt_ids) for e in eps],
            "completion_ids": completion_ids,
            "logprobs": None if any(lp is None for lp in logprobs) else logprobs,
            "env_mask": env_mask,
            "answer_mask": answer_mask,
            "response_text": [e.response_text for e in eps],
            "final_answer": [e.answer for e in eps],
            "num_valid_searches": [e.num_valid_searches for e in eps],
            "num_turns": [e.num_turns for e in eps],
            "num_invalid": [e.num_invalid for e in eps],
            "num_void_turns": [void_turn_count(e.action_texts) for e in eps],
        }

    return rollout


def sampler_logprobs(episode: Episode) -> list[float | None] | None:
    """The sampler's log-prob of each completion token, None on observation tokens (the
    sampler did not choose them; TRL reads None as NaN and leaves it out of its importance
    ratio); None for the whole rollout when they were not kept."""
    if episode.logprobs is None:
        return None
    return [lp if m else None for lp, m in zip(episode.logprobs, episode.action_mask, strict=True)]


def _config_from_trainer(args: Any) -> RolloutConfig:
    return RolloutConfig(
        temperature=float(getattr(args, "temperature", 1.0)),
        top_p=float(getattr(args, "top_p", 1.0)),
        top_k=int(getattr(args, "top_k", 0) or 0),
    )


def _generation_model(trainer: Any):
    """Context manager: the unwrapped model (ZeRO-3 parameters gathered when TRL would)."""
    from trl.models import unwrap_model_for_generation

    return unwrap_model_for_generation(
        trainer.model_wrapped,
        trainer.accelerator,
        gather_deepspeed3_params=getattr(trainer.args, "ds3_gather_for_generation", True),
    )


# ------------------------------------------------------------------------- reward


def gold_answers(value: Any) -> tuple[str, ...]:
    """Gold answers from a dataset cell: a string, a list of strings, or Search-R1's
    `reward_model` dict (`{"ground_truth": {"target": [...]}}`)."""
    if isinstance(value, Mapping):
        truth = value.get("ground_truth", value)
        value = truth.get("target") if isinstance(truth, Mapping) else truth
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Sequence) or hasattr(value, "tolist"):
        items = value.tolist() if hasattr(value, "tolist") else list(value)
        if items and all(isinstance(v, str) for v in items):
            return tuple(items)
    raise DataFormatError(f"gold answers must be a string or a list of strings, got {value!r}")


def search_r1_reward(
    answers_field: str = "golden_answers",
    *,
    metric: str = "em",
    format_reward: FormatRewardConfig | None = None,
) -> Callable[..., list[float]]:
    """A TRL reward function: the metric of each rollout's final answer vs the gold answers.

    With `search_rollout_func` the answer is its `final_answer` field, the answer action of the
    rollout's last turn (None, scoring 0, when the rollout did not end with one), and the
    format check reads its `response_text`. Without those fields it scores TRL's decoded
    completion (or a `response_text` field alone) by its last complete `<answer>` span
    (observations are ignored when extracting it). Gold answers come from the dataset column
    `answers_field` (`golden_answers` in FlashRAG data, `reward_model` in Search-R1 parquet
    files).
    """

    def reward(
        completions: list,
        response_text: list[str] | None = None,
        final_answer: list[str | None] | None = None,
        **kwargs: Any,
    ):
        if answers_field not in kwargs:
            columns = sorted(
                k for k in kwargs if k not in ("trainer_state", "log_extra", "log_metric")
            )
            raise DataFormatError(
                f"reward: the dataset has no column {answers_field!r} with gold answers "
                f"(columns: {', '.join(columns)})"
            )
        texts = response_text if response_text is not None else [_text(c) for c in completions]
        golds = kwargs[answers_field]
        if final_answer is not None:  # the rollout's own final answer action
            return [
                score_answer(
                    a, gold_answers(g), response_text=t, metric=metric, format_config=format_reward
                ).reward
                for a, t, g in zip(final_answer, texts, golds, strict=True)
            ]
        return [
            compute_reward(t, gold_answers(g), metric=metric, format_config=format_reward).reward
            for t, g in zip(texts, golds, strict=True)
        ]

    reward.__name__ = f"search_r1_{metric}"
    return reward


def _text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content", "")) for m in completion if isinstance(m, Mapping))


def search_r1_rows(
    examples: Sequence[Any], template: Any = None, *, chat: bool = False
) -> list[dict[str, Any]]:
    """Dataset rows for TRL from `QAExample`s: `prompt` (text, or one user message with
    `chat=True`), `golden_answers` and `id`; wrap with `datasets.Dataset.from_list`."""
    from llds.env.prompts import PromptTemplate

    tmpl = (
        template
        if isinstance(template, PromptTemplate)
        else (PromptTemplate.default() if template is None else PromptTemplate(template))
    )
    rows = []
    for ex in examples:
        text = tmpl.render(ex.question)
        prompt: Any = [{"role": "user", "content": text}] if chat else text
        rows.append({"prompt": prompt, "golden_answers": list(ex.answers), "id": ex.id})
    return rows


__all__ = [
    "INACTIVE_WARNING",
    "LLDSGRPOConfig",
    "LLDSGRPOTrainer",
    "generation_metrics",
    "gold_answers",
    "lld_metrics_from_inputs",
    "llds_can_act",
    "loss_mask_from_inputs",
    "premb_share_parts",
    "prompt_token_ids",
    "search_r1_reward",
    "search_r1_rows",
    "search_rollout_func",
    "trl_llds_loss",
]
