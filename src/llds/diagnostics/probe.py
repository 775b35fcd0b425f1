"""The one-step likelihood-displacement probe (the paper's per-question diagnostic).

For each question whose sampled group has both correct and incorrect rollouts: from the same
weights, take ONE GRPO update on that group alone, then measure how the log-likelihood of its
correct responses moved. GRPO asks it to rise; a mean below zero is Lazy Likelihood
Displacement: the negative gradients of similar wrong responses dragged the correct ones down.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from llds.algo import group_advantages
from llds.algo.objective import Objective, grpo_objective
from llds.data.example import QAExample
from llds.env.prompts import PromptTemplate, build_prompt_ids
from llds.rollout import RolloutConfig, RolloutEngine, RolloutRequest
from llds.train.evaluate import ModelOnData
from llds.train.forward import batched_log_probs, response_log_probs

if TYPE_CHECKING:
    from llds.env.protocol import Protocol


@dataclass
class ProbeResult:
    example_id: str
    question: str
    n_correct: int
    n_incorrect: int
    disp_correct: float
    """mean over correct responses of sum_t (log pi_new - log pi_old) over model tokens"""
    disp_correct_per_token: float
    disp_incorrect: float
    frac_correct_fell: float


def probe_group(
    model,
    batch,
    *,
    lr: float,
    optimizer: str = "adam",
    clip: float = 0.2,
    aggregation: str = "token-mean",
    token_budget: int = 16384,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One update on `batch` (one question's group); returns (old, new) log-probs `[B, R]`.

    The model's weights are restored before returning.
    """
    saved = copy.deepcopy(model.state_dict())
    try:
        model.eval()
        old, _ = batched_log_probs(model, batch, token_budget)
        adv = group_advantages(batch.rewards, batch.group_ids)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = (
            torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
            if optimizer == "adam"
            else torch.optim.SGD(params, lr=lr)
        )
        model.train()
        opt.zero_grad(set_to_none=True)
        lp, _ = response_log_probs(model, batch)
        loss, _ = grpo_objective(  # the GRPO update alone: no KL, entropy or LLDS
            lp,
            old.to(lp.device),
            adv.to(lp.device),
            batch.loss_mask.to(lp.device),
            Objective(clip_low=clip, aggregation=aggregation),
        )
        loss.backward()
        opt.step()
        model.eval()
        new, _ = batched_log_probs(model, batch, token_budget)
        return old, new
    finally:
        model.load_state_dict(saved)


def run_probe(
    model,
    tokenizer,
    retriever,
    examples: Sequence[QAExample],
    *,
    group_size: int = 8,
    rollout: RolloutConfig | None = None,
    lr: float = 1e-6,
    optimizer: str = "adam",
    seed: int = 0,
    template: PromptTemplate | str | None = None,
    chat: bool | None = None,
    progress: bool = True,
) -> list[ProbeResult]:
    """Probe every example; questions whose group is all-correct or all-wrong are skipped
    (GRPO gives them zero advantage, so there is nothing to displace)."""
    cfg = rollout or RolloutConfig()
    engine = RolloutEngine(model, tokenizer, retriever, cfg)
    results: list[ProbeResult] = []
    from rich.progress import Progress

    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("probe", total=len(examples))
        for i, ex in enumerate(examples):
            ids = build_prompt_ids(tokenizer, ex.question, template, chat=chat)
            reqs = [RolloutRequest(ids, ex.id, ex.id, ex.answers) for _ in range(group_size)]
            gen = torch.Generator().manual_seed(seed * 1_000_003 + i)
            batch = engine.generate(reqs, generator=gen)
            bar.advance(task)
            correct = batch.rewards > 0
            if correct.all() or not correct.any():
                continue
            old, new = probe_group(model, batch, lr=lr, optimizer=optimizer)
            mask = batch.loss_mask
            delta = torch.where(mask, new - old, torch.zeros_like(new)).sum(-1)
            per_tok = delta / mask.sum(-1).clamp(min=1)
            results.append(
                ProbeResult(
                    example_id=ex.id,
                    question=ex.question,
                    n_correct=int(correct.sum()),
                    n_incorrect=int((~correct).sum()),
                    disp_correct=float(delta[correct].mean()),
                    disp_correct_per_token=float(per_tok[correct].mean()),
                    disp_incorrect=float(delta[~correct].mean()),
                    frac_correct_fell=float((delta[correct] < 0).float().mean()),
                )
            )
    return results


def summarize(results: Sequence[ProbeResult]) -> dict[str, Any]:
    n = len(results)
    if n == 0:
        return {"probed": 0}
    return {
        "probed": n,
        "lld_share": sum(r.disp_correct < 0 for r in results) / n,
        "mean_disp_correct": sum(r.disp_correct for r in results) / n,
        "mean_disp_incorrect": sum(r.disp_incorrect for r in results) / n,
        "results": [asdict(r) for r in results],
    }


def plot_probe(results: Sequence[ProbeResult], path, title: str = "One-step probe") -> None:
    """Bar per question (sorted): mean likelihood change of its correct responses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vals = sorted(r.disp_correct for r in results)
    fig, ax = plt.subplots(figsize=(max(6, 0.12 * len(vals) + 3), 3.6))
    colors = ["#c0392b" if v < 0 else "#2e86c1" for v in vals]
    ax.bar(range(len(vals)), vals, color=colors, width=0.85)
    ax.axhline(0, color="black", lw=0.8)
    neg = sum(v < 0 for v in vals)
    ax.set_title(f"{title}: {neg}/{len(vals)} questions with LLD (correct likelihood fell)")
    ax.set_xlabel("question (sorted)")
    ax.set_ylabel("Δ log-lik of correct responses")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@dataclasses.dataclass
class ProbeConfig(ModelOnData):
    """`llds probe`'s options (its flags are generated from these fields)."""

    out: str = dataclasses.field(
        default="", metadata={"help": "directory for probe.json and probe.png"}
    )
    limit: int = dataclasses.field(
        default=64, metadata={"help": "questions to sample (mixed groups are probed)"}
    )
    group_size: int = dataclasses.field(default=8, metadata={"help": "rollouts per question"})
    lr: float = dataclasses.field(default=1e-6, metadata={"help": "step size of the probe update"})
    optimizer: Literal["adam", "sgd"] = dataclasses.field(
        default="adam", metadata={"help": "optimizer of the probe update"}
    )
    temperature: float = dataclasses.field(default=1.0, metadata={"help": "sampling temperature"})
    seed: int = dataclasses.field(default=0, metadata={"help": "sampling seed"})
    device: str = dataclasses.field(default="auto", metadata={"help": "cpu, cuda, auto"})


def probe_model(
    cfg: ProbeConfig, protocol: Protocol | None = None
) -> tuple[dict[str, Any], list[ProbeResult]]:
    """Run the probe on `cfg.model` with its saved protocol (or the given one); writes
    `OUT/probe.json` (and `OUT/probe.png` when a question was probed)."""
    from pathlib import Path

    from llds.data.loaders import load_many
    from llds.env.protocol import Protocol
    from llds.io import write_json
    from llds.retrieval.factory import open_retriever
    from llds.train.config import ModelConfig
    from llds.train.setup import load_model

    proto = protocol or Protocol.read(cfg.model) or Protocol()
    model, tok = load_model(ModelConfig(path=cfg.model, device=cfg.device), device_key="--device")
    rollout = RolloutConfig(
        **proto.rollout_limits(), group_size=cfg.group_size, temperature=cfg.temperature
    )
    template = proto.template()
    results = run_probe(
        model,
        tok,
        open_retriever(cfg.retriever),
        load_many(cfg.data, limit=cfg.limit),
        group_size=cfg.group_size,
        rollout=rollout,
        lr=cfg.lr,
        optimizer=cfg.optimizer,
        seed=cfg.seed,
        template=template,
        chat=proto.chat,
    )
    out = Path(cfg.out)
    summary = summarize(results)
    write_json(out / "probe.json", summary)
    if results:
        plot_probe(results, out / "probe.png")
    return summary, results
