"""A transformers `generate` rollout server for veRL 0.9's async rollout stack, registered as
rollout name ``hf``, so that veRL's own trainer (`RayPPOTrainer`: agent loop, rollout, the
actor's update, its loggers) runs end to end where vLLM, SGLang and TensorRT-LLM cannot, such as
a CPU with `llds.integrations.verl_cpu`.

veRL 0.9.1 ships an `hf` rollout class but registers only vLLM, SGLang and TensorRT-LLM servers
for its trainer (`get_rollout_class("hf", "async")` fails). Load this module in every veRL
process (`VERL_USE_EXTERNAL_MODULES=llds.integrations.verl_cpu,llds.integrations.verl_hf_rollout`)
and set `actor_rollout_ref.rollout.name=hf`. One server per replica, one request at a time,
float32: for checking a recipe, not for speed.

The pieces are veRL's: a `RolloutReplica` launches the server as a named Ray actor; the
`BaseRollout` adapter in the actor worker pushes the trained weights to it after each update;
the server answers veRL's token-in/token-out `generate` with the sampled tokens and their
log-probs under the sampling distribution (temperature applied), which veRL's rollout
correction compares with the actor's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import ray
import torch
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput

ROLLOUT_NAME = "hf"


def _server_name(replica_rank: int) -> str:
    return f"llds_hf_rollout_{replica_rank}"


class HFRolloutServer:
    """A Ray actor holding a transformers causal LM that samples veRL's requests."""

    def __init__(self, model_path: str, config: Any, replica_rank: int) -> None:
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        self.config = config
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.global_steps: Any = None
        torch.manual_seed(int(getattr(config, "seed", 0) or 0) + replica_rank)

    def load_weights(self, state: dict[str, torch.Tensor], global_steps: Any = None) -> int:
        """The actor's weights after its update (veRL's weight sync). Names the model does not
        have are an error: skipping them would sample from stale weights without a word."""
        _, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected:
            raise KeyError(f"weights the rollout model does not have: {unexpected[:5]}")
        self.global_steps = global_steps
        return len(state)

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        """Sample one response to `prompt_ids`; each token's log-prob is taken under the
        distribution it was sampled from (temperature applied; greedy at temperature 0)."""
        limit = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens"))
        max_new = int(limit or self.config.response_length)
        temperature = float(sampling_params.get("temperature", 1.0))
        sample = temperature > 0
        with torch.no_grad():
            out = self.model.generate(
                torch.tensor([prompt_ids]),
                attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                max_new_tokens=max_new,
                do_sample=sample,
                temperature=temperature if sample else None,
                top_k=0 if sample else None,
                top_p=1.0 if sample else None,
                return_dict_in_generate=True,
                output_logits=True,
                pad_token_id=self.model.config.pad_token_id,
            )
        tokens = out.sequences[0, len(prompt_ids) :].tolist()
        logits = torch.stack(out.logits, dim=1)[0].float()
        scaled = logits / temperature if sample else logits
        log_probs = torch.log_softmax(scaled, -1).gather(-1, torch.tensor(tokens)[:, None])
        return TokenOutput(
            token_ids=tokens,
            log_probs=log_probs[:, 0].tolist(),
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )

    # the control calls veRL's replica and checkpoint manager make; a plain model has no
    # cache to free, no engine to pause and no profiler
    async def wake_up(self) -> None: ...
    async def sleep(self) -> None: ...
    async def clear_kv_cache(self) -> None: ...
    async def release_kv_cache(self) -> None: ...
    async def resume_kv_cache(self) -> None: ...
    async def abort_all_requests(self, reject_request: bool = False) -> None: ...
    async def resume_generation(self) -> None: ...
    async def start_profile(self, **kwargs: Any) -> None: ...
    async def stop_profile(self) -> None: ...


class HFRolloutReplica(RolloutReplica):
    """Launches one `HFRolloutServer` per replica, as a named Ray actor on no accelerator."""

    async def launch_servers(self) -> None:
        config = self.model_config  # a DictConfig or veRL's HFModelConfig: both are mappings
        path = config.get("local_path") or config.get("path")
        server = (
            ray.remote(HFRolloutServer)
            .options(name=_server_name(self.replica_rank), num_cpus=0, max_concurrency=16)
            .remote(os.path.expanduser(path), self.config, self.replica_rank)
        )
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"{ROLLOUT_NAME}-rollout-{self.replica_rank}"

    def rollout_worker_use_gpu(self) -> bool:
        return False


class HFRolloutAdapter(BaseRollout):
    """The actor worker's side: sends the updated weights to its replica's server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, *args: Any, **kwargs: Any):
        super().__init__(config, model_config, device_mesh)
        per_replica = max(1, config.tensor_model_parallel_size * config.data_parallel_size)
        self.replica_rank = int(os.environ.get("RANK", "0")) // per_replica

    async def resume(self, tags: list[str]) -> None:
        """Nothing is released between steps."""

    async def release(self) -> None:
        """Nothing to release: the server holds no accelerator memory."""

    async def update_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        wire_format: str = "named_tensors",
        **kwargs: Any,
    ) -> None:
        state = {name: w.detach().to("cpu", torch.float32).clone() for name, w in weights}
        server = ray.get_actor(_server_name(self.replica_rank))
        await server.load_weights.remote(state, kwargs.get("global_steps"))


def register() -> None:
    """Register the server as veRL's async rollout ``hf`` (idempotent)."""
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = f"{__name__}.HFRolloutAdapter"
    RolloutReplicaRegistry.register(ROLLOUT_NAME, lambda: HFRolloutReplica)


register()
