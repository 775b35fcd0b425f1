"""The reading warm start of SmolLM2-135M-Instruct, measured on the trivia-wiki dev split.

Stages, each skipped when its output exists (`--redo` runs it again):
  data   `llds trivia-wiki`: the trivia questions a search over the Wikipedia summaries answers
  index  `llds index --wiki`: BM25 over the summaries
  sft    `llds sft --config sft-smollm2-wiki-rl` (`--plain`: the one-search expert that answers
         with the answer list's first alias, `sft-smollm2-trivia`'s, on the same questions;
         `--lora-r R`: low-rank adapters instead of every weight, `SFT_OUT/adapter`, a few MB
         that a repository can hold, instead of `SFT_OUT/model`)
  ready  `llds.evaluation.readiness` on the dev questions: greedy EM, the share of answers that
         repeat the question, searches per question; EM, mixed groups and entropy per token of
         `--samples` rollouts per question at temperature 1 (what GRPO will learn from)

    python experiments/smollm2_wiki/warm_start.py [--sft-out runs/smollm2-wiki-rl/sft]
        [--steps 60] [--lr LR] [--lora-r R] [--samples 4] [--plain]
        [--stages data,index,sft,ready] [--redo]

Writes `SFT_OUT/readiness.json` and prints its table. Needs the optional packages of the README
(SmolLM2, Red-Trivia, Wikipedia summaries).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from llds.analysis.machine import machine
from llds.config.loader import to_dict
from llds.io import write_json

STAGES = ("data", "index", "sft", "ready")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="data/trivia-wiki", help="trivia-wiki folder")
    ap.add_argument("--index", default="indexes/wiki", help="BM25 index of the summaries")
    ap.add_argument("--sft-out", default="runs/smollm2-wiki-rl/sft")
    ap.add_argument("--steps", type=int, default=None, help="SFT steps (default: the preset's)")
    ap.add_argument("--lr", type=float, default=None, help="SFT learning rate (the preset's)")
    ap.add_argument("--lora-r", type=int, default=None, help="adapters of this rank (alpha 2r)")
    ap.add_argument("--samples", type=int, default=4, help="rollouts per dev question at T=1")
    ap.add_argument("--split", default="dev", help="the split measured (never test/transfer)")
    ap.add_argument("--plain", action="store_true", help="the one-search, first-alias expert")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--redo", action="store_true", help="run stages whose output exists")
    args = ap.parse_args()
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    if set(stages) - set(STAGES) or args.split in ("test", "transfer"):
        ap.error(f"--stages: from {STAGES}; --split: not test or transfer (held out)")
    import torch

    torch.set_num_threads(args.threads)
    data, index, out = Path(args.data), Path(args.index), Path(args.sft_out)

    def todo(stage: str, output: Path) -> bool:
        run = stage in stages and (args.redo or not output.exists())
        print(f"[{stage}] {'running' if run else 'kept'}: {output}", flush=True)
        return run

    if todo("data", data / "counts.json"):
        from llds.data.loaders import load_trivia_lists
        from llds.data.trivia_wiki import TriviaWikiConfig, build_trivia_wiki, write_trivia_wiki
        from llds.retrieval.factory import build_retriever, corpus_passages

        retriever = build_retriever(corpus_passages(None, wiki=True), show_progress=False)
        cfg = TriviaWikiConfig(out=str(data))
        write_trivia_wiki(build_trivia_wiki(load_trivia_lists(None), retriever, cfg), data)
    if todo("index", index):
        from llds.retrieval.factory import build_retriever, corpus_passages

        build_retriever(corpus_passages(None, wiki=True), show_progress=False).save(index)
    if todo("sft", trained(out, args.lora_r)):
        from llds.sft import load_sft_config, run

        given = [f"out={out}", f"data={data / 'train.jsonl'}", f"corpus={index}", "progress=false"]
        given += [f"threads={args.threads}"]
        if args.steps:
            given.append(f"steps={args.steps}")
        if args.lr:
            given.append(f"lr={args.lr}")
        if args.lora_r:
            given += [f"lora.r={args.lora_r}", f"lora.alpha={2 * args.lora_r}"]
        if args.plain:
            given += ["reading=false", "miss_first=0", "think_bank=fixed"]
        run(load_sft_config("sft-smollm2-wiki-rl", given))
    if "ready" in stages:
        measure(args, data, index, out)


def trained(out: Path, lora_r: int | None) -> Path:
    """What the sft stage writes: the adapter with `--lora-r`, else the whole model."""
    return out / ("adapter" if lora_r else "model")


def measure(args: argparse.Namespace, data: Path, index: Path, out: Path) -> None:
    from llds.data.loaders import load_examples
    from llds.evaluation.readiness import readiness
    from llds.models.hf import load_policy
    from llds.policy.lora import load_adapted
    from llds.retrieval.factory import open_retriever
    from llds.train.config import load_config

    started = time.perf_counter()
    warm = trained(out, args.lora_r)
    model, tok = load_adapted(warm) if args.lora_r else load_policy(str(warm))
    examples = load_examples(data / f"{args.split}.jsonl")
    retriever = open_retriever(str(index))
    rollout = dataclasses.replace(load_config("smollm2-wiki-rl").rollout, topk=3, max_rows=64)
    got = readiness(model, tok, retriever, examples, rollout, samples=args.samples)
    result = {
        "machine": machine(),
        "command": "python experiments/smollm2_wiki/warm_start.py " + " ".join(sys.argv[1:]),
        "model": str(warm),
        "split": args.split,
        "rollout": to_dict(rollout),
        "readiness": got.to_dict(),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    write_json(out / "readiness.json", result)
    r = got
    print(
        "| split | questions | greedy EM | answered | answers repeating the question | searches "
        f"| EM at T=1 ({r.samples} per question) | mixed groups | entropy per token |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
        f"| {args.split} | {r.questions} | {r.em:.3f} | {r.answered:.3f} | {r.copy_share:.3f} | "
        f"{r.searches:.2f} | {r.sampled_em:.3f} | {r.mixed_share:.3f} | {r.entropy:.3f} |"
    )
    print(json.dumps({"wall_s": result["wall_s"]}))


if __name__ == "__main__":
    main()
