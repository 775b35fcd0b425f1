"""SmolLM2-135M-Instruct: SFT warm start on trivia, then GRPO vs GRPO+LLDS from it, with held-out
and transfer evaluation and the paper's one-step probe (Fig. 3a); resumable, one command.

Stages (each is skipped when its output already exists, so the command resumes after a stop):
1. data: the `worldcapitals` and `elements` trivia lists shuffled with seed 0; the first 100 are
   held out, the rest are training questions. A second list (`uscapitals`) that neither SFT nor
   RL sees measures transfer. `OUT/data/eval.jsonl` holds both, tagged by `data_source`
   (`held-out`, `transfer`), so every periodic evaluation reports them separately.
2. index: BM25 over the Wikipedia summaries (`OUT/index`).
3. warm start: `llds sft --config sft-smollm2-trivia` on the training questions, then greedy EM
   of the warm start on eval.jsonl (step 0 of every run).
4. probe: the one-step probe (Eq. 3, plain SGD) on the warm start over training questions in
   order until 30 groups mixed correct and incorrect answers, once with one update (the paper's
   Fig. 3a) and once with K updates on the same group with LLDS on or off (LLDS is exactly 0 on
   the first update, where pi_theta = pi_old, so only K > 1 can show it).
5. runs: `llds train --config smollm2-trivia` for each arm and seed, 2 at a time.
6. the table: EM / F1 / valid searches on held-out and transfer at every evaluation, the LLD
   metrics and the probe.

    python experiments/smollm2/run.py --out runs/smollm2-rl [--stages data,index,sft,probe,runs]
                                      [--seeds 0,1,2] [--arms GRPO,GRPO+LLDS] [--parallel 2]
                                      [--probe-questions 64] [--dry-run]

`--dry-run` prints the runs the `runs` stage would start (each unfinished arm and seed, with its
config) and does nothing else. Protocol: experiments/smollm2/PROTOCOL.md; results:
docs/results/smollm2.md.

Needs the optional packages of the README (SmolLM2, Red-Trivia, Wikipedia summaries).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import config_data, finished, print_dry_run, run_unfinished
from llds.analysis.machine import machine
from llds.analysis.source_table import source_table
from llds.runs.eval_result import eval_file
from llds.train.config import TrainConfig, load_config

TRAIN_LISTS = ("worldcapitals", "elements")
TRANSFER_LISTS = ("uscapitals",)
HELD_OUT = 100
SPLIT_SEED = 0
ARMS = {"GRPO": ["algo.llds.enabled=false"], "GRPO+LLDS": ["algo.llds.enabled=true"]}
STAGES = ("data", "index", "sft", "probe", "runs")


def write_data(out: Path) -> Path:
    """Train / eval question files (FlashRAG jsonl); kept when already written."""
    from llds.data.loaders import load_trivia_lists
    from llds.io import write_jsonl

    data = out / "data"
    if (data / "eval.jsonl").is_file():
        return data
    examples = load_trivia_lists(TRAIN_LISTS)
    random.Random(SPLIT_SEED).shuffle(examples)
    held, train = examples[:HELD_OUT], examples[HELD_OUT:]
    transfer = load_trivia_lists(TRANSFER_LISTS)

    def rows(exs, source: str) -> list[dict[str, Any]]:
        return [
            {
                "id": e.id,
                "question": e.question,
                "golden_answers": list(e.answers),
                "data_source": source,
            }
            for e in exs
        ]

    write_jsonl(data / "train.jsonl", rows(train, "trivia"))
    write_jsonl(data / "eval.jsonl", rows(held, "held-out") + rows(transfer, "transfer"))
    print(f"data: {len(train)} training, {len(held)} held-out, {len(transfer)} transfer questions")
    return data


def build_index(out: Path) -> Path:
    from llds.retrieval.factory import build_retriever, corpus_passages

    index = out / "index"
    if not index.is_dir():
        build_retriever(corpus_passages(None, wiki=True), show_progress=False).save(index)
    return index


def warm_start(out: Path, sft_steps: int | None) -> Path:
    """The SFT warm start and its evaluation (the step-0 point of every run)."""
    from llds.evaluation.evaluate import EvalConfig, run_evaluation
    from llds.sft import load_sft_config
    from llds.sft import run as run_sft

    sft = out / "sft"
    if not (sft / "model").is_dir():
        given = {
            "data": str(out / "data" / "train.jsonl"),
            "corpus": str(out / "index"),
            "out": str(sft),
            "threads": 1,
            "progress": False,
        }
        if sft_steps is not None:
            given["steps"] = sft_steps
        run_sft(load_sft_config("sft-smollm2-trivia", given))
    start = eval_file(sft, 0)
    if not start.is_file():
        t0 = time.perf_counter()
        run_evaluation(
            EvalConfig(
                model=str(sft / "model"),
                data=[str(out / "data" / "eval.jsonl")],
                retriever=str(out / "index"),
                out=str(start),
                device="cpu",
            )
        )
        print(f"warm start evaluated in {time.perf_counter() - t0:.0f} s", flush=True)
    return sft


PROBED = 30  # the probe goes through the training questions in order until this many are mixed


def probe(out: Path, name: str, questions: int, updates: int, llds: bool) -> dict[str, Any]:
    """The probe of the warm start on the training questions in order, 8 rollouts each, until
    PROBED of them had mixed groups or `questions` were sampled; cached in
    `OUT/probe/NAME/probe.json`. The other variants then sample only the questions the
    one-update probe probed: their rollouts are the same, so the result is what going through
    all of them would give, and the variants compare question by question."""
    from llds.probe.one_step import ProbeConfig, probe_model

    where = out / "probe" / name
    if (where / "probe.json").is_file():
        return json.loads((where / "probe.json").read_text())
    first = out / "probe" / "one-update"
    if name != "one-update":  # the same questions and rollouts, without sampling the others
        probe(out, "one-update", questions, 1, False)
    cfg = ProbeConfig(
        model=str(out / "sft" / "model"),
        data=[str(out / "data" / "train.jsonl")],
        retriever=str(out / "index"),
        out=str(where),
        limit=questions,
        max_probed=PROBED,
        lr=1e-4,
        updates=updates,
        llds_coef=0.2 if llds else 0.0,
        questions_from="" if name == "one-update" else str(first),
        device="cpu",
    )
    t0 = time.perf_counter()
    summary, _ = probe_model(cfg)
    print(f"probe {name}: {summary} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return summary


PROBES = {  # name: (updates, LLDS on)
    "one-update": (1, False),
    "4-updates": (4, False),
    "4-updates-llds": (4, True),
}


def run_dir(out: Path, arm: str, seed: int) -> Path:
    return out / arm.replace("+", "_") / f"seed{seed}"


def arm_config(out: Path, arm: str, seed: int, steps: int | None) -> TrainConfig:
    return load_config(
        "smollm2-trivia",
        [
            f"run_dir={run_dir(out, arm, seed)}",
            f"seed={seed}",
            f"model.path={out / 'sft' / 'model'}",
            f"data.train={out / 'data' / 'train.jsonl'}",
            f"data.eval={out / 'data' / 'eval.jsonl'}",
            f"retriever.source={out / 'index'}",
            "optim.minibatch_order=shuffled",  # the order the recorded runs used
            *ARMS[arm],
            *([f"steps={steps}"] if steps else []),
        ],
    )


def run_all(
    out: Path,
    seeds: Sequence[int],
    parallel: int,
    steps: int | None,
    arms: Sequence[str] = tuple(ARMS),
) -> None:
    """Every unfinished (arm, seed) of `arms` in its own process, `parallel` at a time."""
    jobs = [arm_config(out, arm, s, steps) for s in seeds for arm in arms]
    run_unfinished(jobs, parallel, 10.0)


def dry_run(
    out: Path, seeds: Sequence[int], steps: int | None, arms: Sequence[str] = tuple(ARMS)
) -> None:
    """Print what `run_all` would start: every unfinished (arm, seed) and its config."""
    configs = [(arm, s, arm_config(out, arm, s, steps)) for s in seeds for arm in arms]
    print_dry_run(
        [
            {"arm": arm, "seed": s, "config": config_data(cfg)}
            for arm, s, cfg in configs
            if not finished(cfg)
        ]
    )


# ------------------------------------------------------------------------------------ report


def table(out: Path, seeds: Sequence[int]) -> str:
    """Every started run's row: per-source EM at each evaluation, reward, displacement."""
    runs = {(arm, seed): run_dir(out, arm, seed) for arm in ARMS for seed in seeds}
    return source_table(runs, eval_file(out / "sft", 0))


def probe_table(out: Path) -> str:
    lines = [
        "| probe | updates | LLDS | questions probed | share whose correct responses lost "
        "likelihood | first-order share | median drag / pull "
        "| mean change of correct / incorrect |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, (updates, llds) in PROBES.items():
        f = out / "probe" / name / "probe.json"
        if not f.is_file():
            continue
        s = json.loads(f.read_text())
        if not s.get("probed"):
            lines.append(f"| {name} | {updates} | {llds} | 0 | - | - | - | - |")
            continue
        lines.append(
            f"| {name} | {updates} | {'on' if llds else 'off'} | {s['probed']} "
            f"| {s['lld_share']:.2f} | {s['first_order_lld_share']:.2f} "
            f"| {s['median_drag_to_pull']:.2f} "
            f"| {s['mean_disp_correct']:+.3f} / {s['mean_disp_incorrect']:+.3f} |"
        )
    return "\n".join(lines)


def write_run_report(out: Path, seeds: Sequence[int]) -> Path | None:
    """`llds report` of every run on disk (both arms, each seed) into `OUT/report`."""
    from llds.report.html import write_report

    runs = {
        f"{arm} seed {s}": run_dir(out, arm, s)
        for arm in ARMS
        for s in seeds
        if (run_dir(out, arm, s) / "metrics.jsonl").is_file()
    }
    if not runs:
        return None
    return write_report(list(runs.values()), out / "report", labels=list(runs))


def probe_pairs(out: Path) -> str:
    """The protocol's LLDS question: on the same questions and rollouts, do fewer correct
    responses lose likelihood over 4 updates with LLDS than without? Also draws
    `OUT/probe/pairs.png`."""
    from llds.analysis.probe_compare import compare_probes, plot_pairs
    from llds.probe.one_step import ProbeResult

    found = {}
    for name in ("4-updates", "4-updates-llds"):
        f = out / "probe" / name / "probe.json"
        if not f.is_file():
            return f"(no {name} probe yet)"
        found[name] = [ProbeResult(**r) for r in json.loads(f.read_text()).get("results", [])]
    a, b = found["4-updates"], found["4-updates-llds"]
    if not a or not b:
        return "(a 4-update probe probed no question)"
    c = compare_probes(a, b)
    plot_pairs(a, b, out / "probe" / "pairs.png", labels=("4 updates", "4 updates with LLDS"))
    return (
        f"4 updates with LLDS vs without, {c.questions} questions: fewer correct responses "
        f"lost likelihood in {c.fewer_fell}, more in {c.more_fell}, the same in {c.same} "
        f"(two-sided sign test p = {c.p_value:.3f}); questions with LLD {c.lld_share_a:.2f} "
        f"without, {c.lld_share_b:.2f} with; mean change of the correct responses "
        f"{c.mean_disp_correct_a:+.3f} without, {c.mean_disp_correct_b:+.3f} with"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/smollm2-rl"))
    ap.add_argument("--stages", default=",".join(STAGES), help=f"any of {','.join(STAGES)}")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"any of {','.join(ARMS)}")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None, help="override the preset's 60 steps")
    ap.add_argument("--sft-steps", type=int, default=None, help="override the warm start's 60")
    ap.add_argument("--probe-questions", type=int, default=128, help="at most this many")
    ap.add_argument("--probes", default=",".join(PROBES), help=f"any of {','.join(PROBES)}")
    ap.add_argument(
        "--dry-run", action="store_true", help="print the runs the runs stage would start; stop"
    )
    args = ap.parse_args()
    stages = {s.strip() for s in args.stages.split(",") if s.strip()}
    unknown = stages - set(STAGES)
    if unknown:
        ap.error(f"--stages: unknown {sorted(unknown)}; choose from {', '.join(STAGES)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not arms or set(arms) - set(ARMS):
        ap.error(f"--arms: unknown {sorted(set(arms) - set(ARMS))}; choose from {', '.join(ARMS)}")
    out: Path = args.out
    if args.dry_run:
        dry_run(out, seeds, args.steps, arms)
        return
    out.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine()}")
    if "data" in stages:
        write_data(out)
    if "index" in stages:
        build_index(out)
    if "sft" in stages:
        warm_start(out, args.sft_steps)
    if "probe" in stages:
        for name in args.probes.split(","):
            updates, llds = PROBES[name]
            probe(out, name, args.probe_questions, updates, llds)
    if "runs" in stages:
        run_all(out, seeds, args.parallel, args.steps, arms)
    print(f"command: `python experiments/smollm2/run.py {' '.join(sys.argv[1:])}`".strip())
    print(table(out, seeds))
    print()
    print(probe_table(out))
    print(probe_pairs(out))
    html = write_run_report(out, seeds)
    if html is not None:
        print(f"run report: {html}")


if __name__ == "__main__":
    main()
