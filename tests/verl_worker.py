"""veRL 0.9's own training code on a CPU, for tests/test_integrations_verl_engine.py.

Usage (in the veRL environment, PYTHONPATH=src):
    python tests/verl_worker.py engine OUT_DIR
    python tests/verl_worker.py trainer OUT_DIR

`engine`: veRL's `ActorRolloutRefWorker` (role "actor": its `TrainingWorker`, FSDP2 engine on
gloo, `ppo_loss` and metric reduction) in this process, driven the way `RayPPOTrainer` drives it
(`_compute_old_log_prob`, `_update_actor`: DataProto -> tensordict without padding -> worker ->
`rename_dict` -> `reduce_metrics`), three times from the same weights on the same batch:
loss_mode vanilla, llds at coefficient 0, llds at 0.2. Every call veRL makes to the registered
loss is recorded (its tensors, unchanged). Writes OUT_DIR/results.json.

`trainer`: veRL's own trainer (`main_ppo`'s `run_ppo` with its `TaskRunner`: Ray, the agent loop,
the `hf` rollout server of `llds.integrations.verl_hf_rollout`, the actor's update with the LLDS
loss, its file logger) for 2 GRPO steps. Writes OUT_DIR/metrics.verl.jsonl (veRL's FileLogger).
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
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

from llds.data.world import WorldConfig, generate_world  # noqa: E402
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


def verl_config(
    model_dir: Path, loss_mode: str, llds: dict[str, float] | None = None, extra: list[str] = ()
):
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
    overrides += list(extra)
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
    tu.assign_non_tensor(
        td, calculate_entropy=True, calculate_sum_pi_squared=False, compute_loss=False
    )
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


def engine(out: Path) -> None:
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(free.getsockname()[1])
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


CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    # a random tiny model never answers: reward an even response length, so that groups are
    # mixed and GRPO's advantages are not all zero
    return float(len(solution_str) % 2 == 0)
"""


def trainer_data(directory: Path) -> Path:
    """Questions of a generated world as veRL's RL parquet files, and a reward function file."""
    import pandas as pd

    directory.mkdir(parents=True, exist_ok=True)
    world = generate_world(WorldConfig(seed=3, num_entities=40, num_train=48, num_test=16))
    for split, questions in (("train", world.train[:8]), ("test", world.test[:4])):
        rows = [
            {
                "data_source": "llds_world",
                "prompt": [{"role": "user", "content": q.question}],
                "ability": "qa",
                "reward_model": {"style": "rule", "ground_truth": q.answers[0]},
                "extra_info": {"index": i, "split": split},
            }
            for i, q in enumerate(questions)
        ]
        pd.DataFrame(rows).to_parquet(directory / f"{split}.parquet")
    (directory / "reward.py").write_text(REWARD)
    return directory


def trainer(out: Path) -> None:
    """veRL's trainer for 2 GRPO steps with the LLDS loss, as `python -m verl.trainer.main_ppo`
    runs it (minus Hydra's command line), logging to its file logger."""
    os.environ["VERL_USE_EXTERNAL_MODULES"] = (
        "llds.integrations.verl_cpu,llds.integrations.verl_hf_rollout"
    )
    os.environ["VERL_FILE_LOGGER_PATH"] = str(out / "metrics.verl.jsonl")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    importlib.import_module("llds.integrations.verl_hf_rollout")
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.main_ppo_v0 import TaskRunner
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    model_dir = tiny_model(out / "model")
    data = trainer_data(out / "data")
    actor, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    config = verl_config(
        model_dir,
        "llds",
        {"llds_coef": 0.2},
        extra=[
            f"data.train_files={data / 'train.parquet'}",
            f"data.val_files={data / 'test.parquet'}",
            "data.train_batch_size=2",
            "data.max_prompt_length=64",
            "data.max_response_length=8",
            "data.dataloader_num_workers=0",
            "data.shuffle=False",
            "algorithm.adv_estimator=grpo",
            "algorithm.use_kl_in_reward=False",
            f'+actor_rollout_ref.model.custom_chat_template="{CHAT_TEMPLATE}"',
            f"{actor}.use_kl_loss=False",
            f"{rollout}.agent.num_workers=1",
            f"{rollout}.tensor_model_parallel_size=1",
            f"{rollout}.dtype=float32",
            "actor_rollout_ref.ref.fsdp_config.strategy=fsdp2",
            f"reward.custom_reward_function.path={data / 'reward.py'}",
            "reward.num_workers=1",
            "trainer.logger=[console,file]",
            "trainer.total_training_steps=2",
            "trainer.total_epochs=1",
            "trainer.device=cpu",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.use_v1=False",  # veRL's v1 trainer needs the transfer_queue package
            f"trainer.default_local_dir={out / 'checkpoints'}",
            # Ray's bookkeeping only: veRL's resource pool counts accelerators ("GPU"), and
            # each worker bundle asks for 3 CPUs
            "ray_kwargs.ray_init.num_cpus=4",
            "+ray_kwargs.ray_init.num_gpus=1",
            "+ray_kwargs.ray_init.include_dashboard=False",
        ],
    )
    validate_config(
        config=config,
        use_reference_policy=need_reference_policy(config),
        use_critic=need_critic(config),
    )
    run_ppo(config, task_runner_class=TaskRunner)


if __name__ == "__main__":
    {"engine": engine, "trainer": trainer}[sys.argv[1]](Path(sys.argv[2]))
