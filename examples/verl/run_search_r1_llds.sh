#!/usr/bin/env bash
# Search-R1-style GRPO + LLDS with veRL. Needs GPUs and veRL (0.9.x) with SGLang or vLLM.
# Not run by the llds test suite. Usage, from the repository root:
#   examples/verl/run_search_r1_llds.sh [extra Hydra overrides...]
set -euo pipefail

CORPUS=${CORPUS:-data/wiki-18.jsonl}          # Search-R1 corpus jsonl (id, contents)
INDEX=${INDEX:-data/wiki-18-bm25}              # built once with `llds index`
PORT=${PORT:-8000}

# 1. The retrieval server, one per node on loopback (Search-R1 API: POST /retrieve).
if [ ! -d "$INDEX" ]; then
  llds index --corpus "$CORPUS" --out "$INDEX"
fi
llds serve-retriever --index "$INDEX" --host 127.0.0.1 --port "$PORT" &
SERVER_PID=$!
trap 'kill "$SERVER_PID"' EXIT
export LLDS_RETRIEVER_URL="http://127.0.0.1:${PORT}/retrieve"
for _ in $(seq 60); do
  curl -fsS -X POST "$LLDS_RETRIEVER_URL" -H 'content-type: application/json' \
    -d '{"queries": ["test"], "topk": 1, "return_scores": true}' >/dev/null 2>&1 && break
  sleep 2
done

# 2. veRL, with the LLDS policy loss (registered by the policy_loss config's _target_). Its file
#    logger writes one {"step", "data"} record per step here: `llds report runs/verl-search-r1`.
RUN_DIR=${RUN_DIR:-runs/verl-search-r1}
mkdir -p "$RUN_DIR"
export VERL_FILE_LOGGER_PATH="$RUN_DIR/metrics.verl.jsonl"
python3 -m verl.trainer.main_ppo \
  --config-path "$(pwd)/examples/verl" --config-name search_r1_llds \
  "$@"
