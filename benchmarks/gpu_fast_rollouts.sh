#!/usr/bin/env bash
# The rollout-speed measurements on one GPU, in one command that fits about ten minutes:
#   1. the native trainer (eager loop, static loop, compiled static loop; pi_old from sampling
#      and recomputed) against TRL's GRPOTrainer at equal work, float32, on the 0.5B shape;
#   2. the same in bf16 (float32 masters and autocast in both), the native update also without
#      the shared-prompt pass (one model call per micro-batch, as TRL);
#   3. one chunk of the theorem study's rollouts: eager vs static vs compiled, same seeds;
#   4. the host-device waits of one more bf16 step, native and TRL (`--count-syncs`; torch's
#      profiler, `--profile`, hung twice on this GPU).
# Each part runs under its own time limit, in order of importance, and writes its log to OUTDIR
# as it goes, so a run stopped early keeps what finished.
#
#   benchmarks/gpu_fast_rollouts.sh [OUTDIR]       # default runs/gpu_fast_rollouts
#   THEOREM_MODEL=runs/theorem_world/model benchmarks/gpu_fast_rollouts.sh
#   DRY=1 benchmarks/gpu_fast_rollouts.sh          # the same commands on a CPU at toy sizes
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/gpu_fast_rollouts}
py=${PYTHON:-python3}
mkdir -p "$out"
if [ "${DRY:-0}" = 1 ]; then
    dev=cpu shape=tiny prompts=2 tokens=8 mb=2 repeats=1 scale=4
else
    dev=cuda shape=qwen2.5-0.5b prompts=16 tokens=128 mb=4 repeats=2 scale=1
fi
common=(--device "$dev" --shape "$shape" --prompts "$prompts" --tokens "$tokens"
    --mini-batches "$mb" --repeats "$repeats")

part() {  # part NAME SECONDS ARGS...: one benchmark under a time limit, logged as it runs
    local name=$1 limit=$(($2 * scale))
    shift 2
    echo "=== $name, $(date -u +%T), limit ${limit} s: $*"
    timeout "$limit" "$py" "$@" 2>&1 | tee "$out/$name.log"
    echo "=== $name exit ${PIPESTATUS[0]} at $(date -u +%T)"
}

"$py" - <<'EOF'
import torch, transformers
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
print(f"torch {torch.__version__}, transformers {transformers.__version__}, {gpu}", flush=True)
EOF
part vs_trl_fp32 200 benchmarks/vs_trl.py "${common[@]}" \
    --arms dynamic,auto,recompute,compiled,trl
part vs_trl_bf16 200 benchmarks/vs_trl.py "${common[@]}" --dtype bfloat16 \
    --arms dynamic,compiled,compiled-unshared,trl
part rollout_theorem 110 benchmarks/rollout_speed.py --world theorem --device "$dev" \
    --compile --repeats "$repeats" ${THEOREM_MODEL:+--theorem-model "$THEOREM_MODEL"}
part syncs_bf16 90 benchmarks/vs_trl.py "${common[@]}" --dtype bfloat16 --repeats 1 \
    --arms compiled,trl --count-syncs
