"""Plug LLDS and the search rollout into other RL trainers.

- `llds.integrations.trl`: `LLDSGRPOTrainer` / `LLDSGRPOConfig` (TRL's GRPOTrainer + LLDS + LLD
  metrics), `search_rollout_func` (multi-turn search rollouts as TRL's `rollout_func`) and
  `search_r1_reward`. Needs the `trl` extra.
- `llds.integrations.verl`: `verl_llds_policy_loss` and `register()` for veRL's policy-loss
  registry, `LLDSPolicyLossConfig` for the actor's `policy_loss` block. Imports veRL lazily.
- `llds.integrations.verl_cpu` and `llds.integrations.verl_hf_rollout`: veRL plugins (loaded
  through `VERL_USE_EXTERNAL_MODULES`) that run veRL's actor update and trainer on a CPU, for
  checking a recipe before it goes to GPUs. They import veRL when loaded.

Nothing is imported here, so `import llds.integrations` never pulls in TRL or veRL.
"""
