"""The probe's update of one question's group: plain SGD (Eq. 3) or the training optimizer.

The paper measures displacement after one update with the optimizer training uses (AdamW at the
training learning rate). Each question gets a fresh optimizer, so Adam's first step has no
history: its moments are this group's gradient alone, and the step moves every weight by about
`lr` against the sign of its gradient (plus decoupled weight decay). The first-order
prediction (`<grad log pi(y), -grad L>`, Eq. 3) stays the plain-SGD direction's: it predicts
what an SGD step changes. Adam rescales every coordinate of the step, so under `adamw` the
measured change is not `lr` times that prediction and can differ from it in sign: the measured
change says what training's own step does, the first-order terms what the gradient asks for.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, NamedTuple

import torch

from llds.algo import group_advantages
from llds.algo.llds_in_force import LLDSInForce
from llds.algo.objective import TermInputs, grpo_objective
from llds.config.algo import AlgoConfig
from llds.policy.forward import response_log_probs

ProbeOptimizer = Literal["sgd", "adamw"]
PROBE_OPTIMIZERS: tuple[str, ...] = ("sgd", "adamw")


class AdamSettings(NamedTuple):
    """AdamW's settings for the `adamw` probe update; the defaults are the trainer's (`optim.*`),
    so a probe that should step as a run does takes that run's values."""

    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01


TRAINER_ADAM = AdamSettings()
"""the trainer's default AdamW settings (`optim.betas`, `optim.eps`, `optim.weight_decay`)"""


def make_optimizer(
    params: Iterable[torch.nn.Parameter],
    optimizer: str,
    lr: float,
    adam: AdamSettings = TRAINER_ADAM,
) -> torch.optim.Optimizer:
    """A fresh optimizer for one question's update (no state carried between questions)."""
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if optimizer == "adamw":
        return torch.optim.AdamW(
            params,
            lr=lr,
            betas=tuple(adam.betas),
            eps=adam.eps,
            weight_decay=adam.weight_decay,
        )
    raise ValueError(f"probe optimizer must be one of {PROBE_OPTIMIZERS}, got {optimizer!r}")


def apply_updates(
    model,
    batch,
    old: torch.Tensor,
    opt: torch.optim.Optimizer,
    objective: AlgoConfig,
    *,
    updates: int = 1,
    temperature: float = 1.0,
    llds: LLDSInForce | None = None,
) -> None:
    """`updates` GRPO steps of `opt` on `batch` in place, against the sampling log-probs `old`
    (scored at the sampling `temperature`, as the trainer scores), with `objective`'s terms and
    the LLDS `llds` applies (None: `objective.llds`'s). LLDS acts as in training: from the
    second step on unless `first_update: computed` (on the first, pi_theta = pi_old)."""
    adv = group_advantages(batch.rewards, batch.group_ids)
    model.train()
    for update in range(updates):
        opt.zero_grad(set_to_none=True)
        lp, _ = response_log_probs(model, batch, temperature=temperature)
        x = TermInputs(  # the GRPO update (+ LLDS): no KL or entropy term
            log_probs=lp,
            old_log_probs=old.to(lp.device),
            advantages=adv.to(lp.device),
            loss_mask=batch.loss_mask.to(lp.device),
            answer_mask=batch.answer_mask.to(lp.device) if llds and llds.masks_answer else None,
            llds=llds,
            first_update=update == 0,
        )
        loss, _ = grpo_objective(x, objective)
        loss.backward()
        opt.step()
    model.eval()
