"""Worker for tests/test_integrations_verl_engine.py: veRL 0.9's own actor update on a CPU.

Usage: python tests/verl_engine_worker.py OUT_DIR   (in the veRL environment, PYTHONPATH=src)

Builds a tiny random model, then runs veRL's `ActorRolloutRefWorker` (role "actor": its
`TrainingWorker`, FSDP2 engine on gloo, `ppo_loss` and metric reduction) in this process, driven
the way `RayPPOTrainer` drives it (`_compute_old_log_prob`, `_update_actor`: DataProto ->
tensordict without padding -> worker -> `rename_dict` -> `reduce_metrics`), three times from the
same weights on the same batch: loss_mode vanilla, llds at coefficient 0, llds at 0.2. Every
call veRL makes to the registered loss is recorded (its tensors, unchanged). Writes
OUT_DIR/results.json for the test to check.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import sys
from pathlib import Path

os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
with socket.socket() as _s:
    _s.bind(("127.0.0.1", 0))
    os.environ["MASTER_PORT"] = str(_s.getsockname()[1])

import torch

torch.set_num_threads(1)

importlib.import_module("llds.integrations.verl_cpu")  # before veRL resolves its platform

import verl  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.metric import reduce_metrics  # noqa: E402
from verl.utils.py_functional import rename_dict  # noqa: E402
from verl.workers.engine_workers import ActorRolloutRefWorker  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding  # noqa: E402

from llds.models.bpe import train_bpe_tokenizer  # noqa: E402
from llds.models.tiny import save_tiny, tiny_causal_lm_for  # noqa: E402

PROMPTS, N = 2, 4  # 8 rollouts in 2 groups
MINI_BATCH_PROMPTS, EPOCHS, MICRO = 1, 2, 2  # 2 mini-batches x 2 epochs = 4 optimizer steps
PROMPT_LEN, RESPONSE_LEN = 6, 8
SENTENCES = [
    "the capital of france is paris and the capital of spain is madrid",
    "search for the answer then answer with the name you found",
]


def tiny_model(directory: Path) -> Path:
    tok = train_bpe_tokenizer(SENTENCES * 3, vocab_size=300)
    model = tiny_causal_lm_for(tok, hidden_size=32, num_layers=2, num_heads=4, seed=0)
    return save_tiny(model, tok, directory)


def verl_config(model_dir: Path, loss_mode: str, llds: dict[str, float] | None = None):
    """veRL's own trainer config (Hydra compose of its ppo_trainer.yaml), set for a CPU."""
    actor = "actor_rollout_ref.actor"
    overrides = [
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        f"{actor}.strategy=fsdp2",
        f"{actor}.fsdp_config.strategy=fsdp2",
        f"+{actor}.fsdp_config.mixed_precision={{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}}",
        f"{actor}.ppo_mini_batch_size={MINI_BATCH_PROMPTS}",
        f"{actor}.ppo_micro_batch_size_per_gpu={MICRO}",
        f"{actor}.ppo_epochs={EPOCHS}",
        f"{actor}.optim.lr=0.01",
        f"{actor}.optim.weight_decay=0.0",
        f"{actor}.use_torch_compile=False",
        f"{actor}.fsdp_config.use_torch_compile=False",
        "actor_rollout_ref.rollout.name=hf",
        f"actor_rollout_ref.rollout.n={N}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
    ]
    if loss_mode == "llds":
        loss = f"{actor}.policy_loss"
        overrides += [
            f"{loss}._target_=llds.integrations.verl.LLDSPolicyLossConfig",
            f"{loss}.loss_mode=llds",
            *[f"+{loss}.{k}={v}" for k, v in (llds or {}).items()],
        ]
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def rollout_batch(vocab: int, pad: int) -> DataProto:
    """Rollouts in veRL's layout: left-padded prompts, right-padded responses, one masked tool
    token inside a response, GRPO advantages (z-scored rewards per group) on response tokens."""
    g = torch.Generator().manual_seed(0)
    rows = PROMPTS * N
    prompt_lens, response_lens = [6, 4, 6, 4, 5, 5, 3, 6], [8, 5, 7, 8, 3, 8, 6, 4]
    prompts = torch.full((rows, PROMPT_LEN), pad, dtype=torch.long)
    responses = torch.full((rows, RESPONSE_LEN), pad, dtype=torch.long)
    prompt_mask = torch.zeros(rows, PROMPT_LEN, dtype=torch.long)
    response_mask = torch.zeros(rows, RESPONSE_LEN, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        prompts[i, PROMPT_LEN - p :] = torch.randint(1, vocab, (p,), generator=g)
        responses[i, :r] = torch.randint(1, vocab, (r,), generator=g)
        prompt_mask[i, PROMPT_LEN - p :] = 1
        response_mask[i, :r] = 1
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    loss_mask = response_mask.clone()
    loss_mask[1, 2] = 0  # a tool response between two actions
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]).view(PROMPTS, N)
    z = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)
    advantages = (z.view(-1, 1) * loss_mask).float()
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "response_mask": loss_mask,
            "advantages": advantages,
            "returns": advantages,
        },
        meta_info={"temperature": 1.0},
    )


def old_log_probs(worker, batch: DataProto) -> DataProto:
    """`RayPPOTrainer._compute_old_log_prob` on the engine workers, without Ray."""
    td = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(td, calculate_entropy=True, calculate_sum_pi_squared=False)
    tu.assign_non_tensor(td, compute_loss=False)
    out = worker.compute_log_prob(td)
    log_probs = no_padding_2_padding(tu.get(out, "log_probs"), td)
    return DataProto.from_dict(tensors={"old_log_probs": log_probs.float()})


def update_actor(worker, cfg, batch: DataProto) -> dict[str, float]:
    """`RayPPOTrainer._update_actor` on the engine workers, without Ray: veRL's reduced metrics."""
    rollout, actor = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
    batch.meta_info.update(multi_turn=rollout.multi_turn.enable, temperature=rollout.temperature)
    td = left_right_2_no_padding(batch.to_tensordict())
    mini = actor.ppo_mini_batch_size * rollout.n
    tu.assign_non_tensor(
        td,
        calculate_entropy=False,
        distillation_use_topk=False,
        distillation_only=False,
        global_batch_size=mini,
        mini_batch_size=mini,
        epochs=actor.ppo_epochs,
        seed=actor.data_loader_seed,
        dataloader_kwargs={"shuffle": actor.shuffle},
        compute_loss=True,
    )
    metrics = rename_dict(tu.get(worker.update_actor(td), "metrics"), "actor/")
    return {k: float(v) for k, v in reduce_metrics(metrics).items()}


def weights(worker) -> dict[str, torch.Tensor]:
    params, _ = worker.actor.engine.get_per_tensor_param()
    return {name: p.detach().float().clone() for name, p in params}


def run(model_dir: Path, loss_mode: str, llds: dict[str, float] | None, batch: DataProto):
    """One update from the model's initial weights; the loss's calls recorded as veRL makes them."""
    cfg = verl_config(model_dir, loss_mode, llds)
    worker = ActorRolloutRefWorker(config=cfg.actor_rollout_ref, role="actor")
    worker.init_model()  # builds the policy-loss config: registers "llds" with veRL
    loss_fn = core_algos.POLICY_LOSS_REGISTRY[loss_mode]
    calls: list[dict] = []

    def recorded(**kw):
        loss, metrics = loss_fn(**kw)
        calls.append(
            {
                "old": kw["old_log_prob"].tolist(),
                "new": kw["log_prob"].detach().tolist(),
                "adv": kw["advantages"].tolist(),
                "mask": kw["response_mask"].int().tolist(),
                "batch_num_tokens": kw["config"].global_batch_info.get("batch_num_tokens"),
                "metrics": {k: float(v) for k, v in metrics.items()},
            }
        )
        return loss, metrics

    core_algos.POLICY_LOSS_REGISTRY[loss_mode] = recorded
    try:
        before = weights(worker)
        batch = DataProto.from_dict(tensors=dict(batch.batch.items()), meta_info=batch.meta_info)
        batch = batch.union(old_log_probs(worker, batch))
        metrics = update_actor(worker, cfg, batch)
    finally:
        core_algos.POLICY_LOSS_REGISTRY[loss_mode] = loss_fn
    return before, weights(worker), metrics, calls


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def main(out: Path) -> None:
    model_dir = tiny_model(out / "model")
    config = json.loads((model_dir / "config.json").read_text())
    batch = rollout_batch(config["vocab_size"], config.get("pad_token_id") or 0)
    runs = {
        "vanilla": run(model_dir, "vanilla", None, batch),
        "llds0": run(model_dir, "llds", {"llds_coef": 0.0}, batch),
        "llds": run(model_dir, "llds", {"llds_coef": 0.2}, batch),
    }
    start, vanilla = runs["vanilla"][0], runs["vanilla"][1]
    results = {
        "calls_per_step": MINI_BATCH_PROMPTS * N // MICRO,
        "same_start": all(max_diff(start, r[0]) == 0 for r in runs.values()),
        "vanilla_moved": max_diff(start, vanilla),
        "llds0_vs_vanilla_bitwise": all(
            torch.equal(vanilla[k], runs["llds0"][1][k]) for k in vanilla
        ),
        "llds_vs_vanilla": max_diff(vanilla, runs["llds"][1]),
        "runs": {name: {"metrics": r[2], "calls": r[3]} for name, r in runs.items()},
    }
    (out / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
