"""`llds.sft.run`'s work, top to bottom: data, model, loop, save, then a greedy check.

Each part takes the `SFTConfig` itself, so no setting is restated on the way: the expert's
settings go to `build_expert_episodes` by name (`inputs.EXPERT_KEYS`), the loop's to
`sft_train` (`LOOP_KEYS`). What the run did is logged through `llds.sft`.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llds.config.loader import to_dict
from llds.errors import UserInputError
from llds.io import write_json
from llds.sft.config import SFTConfig
from llds.sft.data import ExpertDataStats, ExpertEpisode
from llds.sft.inputs import SFTInputs, expert_episodes, read_inputs

if TYPE_CHECKING:
    from llds.sft.trainer import SFTResult

log = logging.getLogger("llds.sft")

LOOP_KEYS = (
    "lr",
    "steps",
    "epochs",
    "batch_size",
    "micro_batch_tokens",
    "warmup",
    "seed",
    "progress",
    "loss_on",
)
"""`SFTConfig` fields that `sft_train` takes as they are, under the same names."""


def warm_start(cfg: SFTConfig) -> dict[str, Any]:
    """Build the expert trajectories, train, save the model with its protocol, evaluate; returns
    the report that is also written to `OUT/sft_report.json`."""
    _check_before_work(cfg)
    started = time.perf_counter()
    inputs = read_inputs(cfg)  # before the model: a dead retrieval service is one line, at once
    from llds.sft.trainer import sft_train  # torch: after the inputs' checks

    model, tok = model_and_tokenizer(cfg, inputs)
    episodes, stats = expert_episodes(cfg, inputs, tok)
    n_params = sum(p.numel() for p in model.parameters())
    log.info(_data_line(episodes, stats, n_params))
    if cfg.lora is not None:
        from llds.policy.lora import attach_lora

        model = attach_lora(model, cfg.lora)
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log.info("LoRA rank %d: %.2fM adapter parameters train", cfg.lora.r, trained / 1e6)
    loop = {key: getattr(cfg, key) for key in LOOP_KEYS}
    result = sft_train(model, tok, episodes, out_dir=cfg.out, base_path=cfg.model, **loop)
    report = _report(cfg, stats, n_params, episodes, result)
    _write_protocol(cfg, inputs, result.model_dir)
    log.info(
        "SFT loss %.3f -> %.3f in %d steps (%.0f s)",
        result.initial_loss,
        result.final_loss,
        result.steps,
        result.wall_s,
    )
    if cfg.eval and inputs.test:
        report["eval"] = _evaluate(cfg, inputs, model, tok)
    report["total_wall_s"] = round(time.perf_counter() - started, 2)
    write_json(Path(cfg.out) / "sft_report.json", json.loads(json.dumps(report, default=str)))
    log.info("model written to %s", result.model_dir)
    return report


def _check_before_work(cfg: SFTConfig) -> None:
    """Every setting, and a model directory at once (before the data is prepared), with a
    `chat=true` its tokenizer cannot follow; then torch's CPU threads as `threads` sets them."""
    cfg.validate()
    if cfg.model:
        from llds.models.hf import check_chat, check_model_source

        check_model_source("model", cfg.model)
        check_chat("chat", cfg.model, cfg.chat)
    elif cfg.tiny and cfg.chat:  # a BPE tokenizer fitted to the world: a base model's
        raise UserInputError("chat: true, but tiny=true's tokenizer has no chat template")
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)


def model_and_tokenizer(cfg: SFTConfig, inputs: SFTInputs) -> tuple[Any, Any]:
    """The model to warm-start and its tokenizer: `tiny=true`'s fresh one fitted to the corpus,
    `smollm2`, or a model directory / hub id, on `device`."""
    from llds.policy.setup import resolve_device

    if bool(cfg.tiny) == bool(cfg.model):
        raise UserInputError("give exactly one of tiny=true or model=PATH")
    device = str(resolve_device(cfg.device, "device"))
    if cfg.tiny:
        if not Path(inputs.corpus).is_file():
            raise UserInputError(
                "tiny=true fits its tokenizer to a corpus: give world=DIR or a corpus=FILE .jsonl"
            )
        from llds.sft.tiny import tiny_model_and_tokenizer

        model, tok = tiny_model_and_tokenizer(cfg, inputs.corpus, inputs.train, inputs.template)
        return model.to(device), tok
    if cfg.model == "smollm2":
        from llds.models import load_smollm2

        return load_smollm2(device=device)
    from llds.models import load_policy

    return load_policy(cfg.model, device=device)


def _data_line(episodes: list[ExpertEpisode], stats: ExpertDataStats, n_params: int) -> str:
    """What the expert laid out and the model's size, in one line."""
    return (
        f"{len(episodes)} trajectories of {stats.kept} questions "
        f"({stats.to_dict()['kept_by_hops']} by hops; "
        f"{stats.early_answers} stopping early, {stats.searched_twice} searching twice, "
        f"{stats.skipped_hops} skipped by max_hops, {stats.skipped_no_gold_in_retrieval} "
        f"without the answer in retrieval), {_mean_len(episodes):.0f} tokens each on average; "
        f"model {n_params / 1e6:.2f}M parameters"
    )


def _mean_len(episodes: list[ExpertEpisode]) -> float:
    return sum(len(e) for e in episodes) / max(len(episodes), 1)


def _report(
    cfg: SFTConfig,
    stats: ExpertDataStats,
    n_params: int,
    episodes: list[ExpertEpisode],
    result: SFTResult,
) -> dict[str, Any]:
    return {
        "options": to_dict(cfg),
        "data": stats.to_dict(),
        "parameters": n_params,
        "mean_tokens_per_trajectory": _mean_len(episodes),
        "initial_loss": result.initial_loss,
        "final_loss": result.final_loss,
        "sft_wall_s": round(result.wall_s, 2),
    }


def _write_protocol(cfg: SFTConfig, inputs: SFTInputs, model_dir: Path | None) -> None:
    """Beside the weights: what `llds eval` / `llds train` need to talk to this model as SFT
    taught it (prompt, chat, top-k, turns, observation cap)."""
    from llds.env.protocol import Protocol

    Protocol(
        prompt_template=None if inputs.template is None else inputs.template.text,
        chat=cfg.chat,
        topk=cfg.topk,
        max_turns=cfg.eval_max_turns,
        max_obs_tokens=cfg.max_obs_tokens,
    ).write(model_dir)


def _evaluate(cfg: SFTConfig, inputs: SFTInputs, model: Any, tok: Any) -> dict[str, Any]:
    """Greedy EM on the first `eval` test questions, logged as a table; returns its overall and
    per-hop scores."""
    from llds.evaluation.evaluate import evaluate, results_table
    from llds.rollout import RolloutConfig

    rollout = RolloutConfig(
        max_turns=cfg.eval_max_turns,
        temperature=0.0,
        topk=cfg.topk,
        max_obs_tokens=cfg.max_obs_tokens,
    )
    res = evaluate(
        model,
        tok,
        inputs.retriever,
        inputs.test[: cfg.eval],
        rollout,
        template=inputs.template,
        chat=cfg.chat,
        progress=cfg.progress,
    )
    log.info("%s", results_table(res))
    scores = res.to_dict()
    return {k: scores[k] for k in ("overall", "by_hops")}
