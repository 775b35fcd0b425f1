"""`llds sft`: supervised warm start on expert search trajectories (before GRPO)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from llds.errors import ConfigError, UserInputError

HELP = "supervised warm start: teach a model the search protocol on expert trajectories"

# Defaults tuned on the organism world (see the README, "Warm start with SFT"): enough SFT to
# learn the protocol and single-hop lookups, little enough that multi-hop is left for RL.
DEFAULTS: dict[str, Any] = {
    "world": None,
    "data": None,
    "corpus": None,
    "model": None,
    "tiny": False,
    "tokenizer_vocab": 4000,
    "hidden": 128,
    "layers": 4,
    "heads": 4,
    "name_tokens": False,
    "max_hops": None,
    "num_examples": None,
    "relabel_copies": 0,
    "loss_on": "actions",
    "early_answer": 0.0,
    "steps": 150,
    "epochs": None,
    "lr": 3e-3,
    "batch_size": 8,
    "micro_batch_tokens": 8192,
    "warmup": 10,
    "topk": 3,
    "max_obs_tokens": 500,
    "no_think": False,
    "chat": None,
    "prompt_template": None,
    "eval": 0,
    "eval_max_turns": 4,
    "seed": 0,
    "device": "cpu",
    "threads": None,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    # Every default is None here and resolved in `resolve_options` (CLI > --config > DEFAULTS),
    # so a value given on the command line always wins over the config file.
    src = p.add_argument_group("data")
    src.add_argument(
        "--world", help="a world folder from `llds world` (train.jsonl + corpus.jsonl)"
    )
    src.add_argument(
        "--data",
        help="questions: .parquet (Search-R1), .jsonl (FlashRAG) or "
        "trivia:LIST (one-hop trajectories, see README)",
    )
    src.add_argument(
        "--corpus",
        help="corpus .jsonl, index dir or retriever URL (default: the world's corpus.jsonl)",
    )
    src.add_argument("--config", help="YAML file of defaults, keys = option names (e.g. max_hops)")
    mdl = p.add_argument_group("model")
    mdl.add_argument("--model", help="HF model directory, cached hub id, or `smollm2`")
    mdl.add_argument(
        "--tiny",
        action="store_const",
        const=True,
        help="fresh tiny Qwen2 model + BPE tokenizer fitted to the world",
    )
    mdl.add_argument(
        "--tokenizer-vocab", type=int, help=f"BPE size for --tiny ({DEFAULTS['tokenizer_vocab']})"
    )
    mdl.add_argument("--hidden", type=int, help=f"--tiny hidden size ({DEFAULTS['hidden']})")
    mdl.add_argument("--layers", type=int, help=f"--tiny layers ({DEFAULTS['layers']})")
    mdl.add_argument("--heads", type=int, help=f"--tiny attention heads ({DEFAULTS['heads']})")
    mdl.add_argument(
        "--name-tokens",
        action=argparse.BooleanOptionalAction,
        help="--tiny: make every passage title (entity name) one token (default off)",
    )
    mdl.add_argument("--device", help="cpu, cuda, ... (cpu)")
    mdl.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads (default: torch's choice; 1 is often fastest for tiny models)",
    )
    mdl.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        help="use the tokenizer's chat template (default: when it has one)",
    )
    mdl.add_argument("--prompt-template", help="template file containing {question}")
    dat = p.add_argument_group("what the warm start teaches")
    dat.add_argument("--max-hops", type=int, help="train only on questions with <= this many hops")
    dat.add_argument("--num-examples", type=int, help="at most this many trajectories")
    dat.add_argument("--topk", type=int, help=f"passages per search ({DEFAULTS['topk']})")
    dat.add_argument("--max-obs-tokens", type=int, help="observation token cap (500)")
    dat.add_argument(
        "--no-think", action="store_const", const=True, help="expert actions without <think> text"
    )
    dat.add_argument(
        "--relabel-copies",
        type=int,
        help="--world: also train on K copies of the world with entity names "
        "permuted (the same names on other facts), so only reading pays (0)",
    )
    dat.add_argument(
        "--early-answer",
        type=float,
        help="share of chain trajectories (--world) where the expert stops searching "
        "early and answers with the last name it read (wrong), as untrained "
        "models do; leaves a general behaviour for RL to learn (0)",
    )
    dat.add_argument(
        "--loss-on",
        choices=["actions", "all"],
        help="tokens trained on: the expert's actions, or all (passages and "
        "questions too; grows copying in small models) (actions)",
    )
    opt = p.add_argument_group("optimisation")
    opt.add_argument("--steps", type=int, help=f"optimizer steps ({DEFAULTS['steps']})")
    opt.add_argument("--epochs", type=float, help="passes over the trajectories (instead of steps)")
    opt.add_argument("--lr", type=float, help=f"peak learning rate ({DEFAULTS['lr']})")
    opt.add_argument(
        "--batch-size", type=int, help=f"trajectories per step ({DEFAULTS['batch_size']})"
    )
    opt.add_argument("--micro-batch-tokens", type=int, help="padded tokens per forward (8192)")
    opt.add_argument("--warmup", type=int, help=f"warm-up steps ({DEFAULTS['warmup']})")
    opt.add_argument("--seed", type=int, help="seed for init, shuffling, think phrases (0)")
    p.add_argument(
        "--eval",
        type=int,
        help="after training, greedy-evaluate this many test questions of the world (0 = skip)",
    )
    p.add_argument("--eval-max-turns", type=int, help="searches allowed in that evaluation (4)")
    p.add_argument("--out", required=True, help="output folder (model/ goes inside)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def resolve_options(args: argparse.Namespace) -> dict[str, Any]:
    """Command line > `--config` YAML > `DEFAULTS`; unknown config keys are an error."""
    from_file: dict[str, Any] = {}
    if getattr(args, "config", None):
        from llds.train.configio import read_yaml

        from_file = read_yaml(args.config)
        unknown = sorted(set(from_file) - set(DEFAULTS))
        if unknown:
            raise ConfigError(f"{args.config}: unknown key(s) {unknown}; known: {sorted(DEFAULTS)}")
    opts: dict[str, Any] = {}
    for key, default in DEFAULTS.items():
        cli = getattr(args, key, None)
        opts[key] = cli if cli is not None else from_file.get(key, default)
    if opts["steps"] is not None and opts["epochs"] is not None:
        if getattr(args, "epochs", None) is not None and getattr(args, "steps", None) is None:
            opts["steps"] = None  # --epochs on the command line replaces the default steps
        elif getattr(args, "steps", None) is not None:
            opts["epochs"] = None
        else:
            raise ConfigError("give steps or epochs, not both")
    if not 0.0 <= float(opts["early_answer"] or 0.0) <= 1.0:
        raise ConfigError(f"early_answer must be in [0, 1], got {opts['early_answer']}")
    return opts


def _load_examples(opts: dict[str, Any]) -> tuple[list[Any], list[Any], str | None]:
    """(train examples, test examples, default corpus path)."""
    from llds.data.loaders import load_examples, load_flashrag_jsonl

    if bool(opts["world"]) == bool(opts["data"]):
        raise UserInputError("give exactly one of --world DIR or --data FILE")
    if opts["world"]:
        world = Path(opts["world"])
        train_file, test_file, corpus = (
            world / n for n in ("train.jsonl", "test.jsonl", "corpus.jsonl")
        )
        if not train_file.is_file() or not corpus.is_file():
            raise UserInputError(
                f"{world}: not a world folder (needs train.jsonl and "
                "corpus.jsonl; create one with `llds world --out DIR`)"
            )
        test = load_flashrag_jsonl(test_file) if test_file.is_file() else []
        return load_flashrag_jsonl(train_file), test, str(corpus)
    return load_examples(opts["data"]), [], None


def _tokenizer_texts(template: Any) -> list[str]:
    """Text the tiny model will read besides the corpus: the prompt and the expert phrasing."""
    from llds.env.prompts import DEFAULT_INSTRUCTION
    from llds.train.sft_data import EXPERT_PHRASES

    prompt = DEFAULT_INSTRUCTION if template is None else template.text
    phrases = list(EXPERT_PHRASES)
    return [prompt] * 5 + phrases


def tiny_tokenizer(
    corpus: str,
    train: list[Any],
    vocab_size: int,
    *,
    template: Any = None,
    name_tokens: bool = True,
) -> Any:
    """BPE fitted to the corpus, the training questions, the prompt and the expert phrasing.

    With `name_tokens`, every passage title becomes one added token. In the synthetic world the
    titles are the entity names, so a tiny model copies a name (question -> query, passage ->
    next query or answer) as one token instead of a run of syllable pieces; without this, copying
    is what a CPU-sized model fails to learn in minutes.
    """
    from llds.models import train_bpe_tokenizer
    from llds.retrieval.base import Hit
    from llds.retrieval.corpus import read_corpus

    passages = [p.contents for p in read_corpus(corpus)]
    texts = passages + [ex.question for ex in train] + _tokenizer_texts(template)
    names: list[str] = []
    if name_tokens:
        titles = (Hit("", text, 0.0).title.strip() for text in passages)
        names = sorted({t for t in titles if t and " " not in t})
    return train_bpe_tokenizer(texts, vocab_size + len(names), extra_tokens=names)


def _model_and_tokenizer(opts: dict[str, Any], corpus: str | None, template: Any, train: list[Any]):
    if bool(opts["tiny"]) == bool(opts["model"]):
        raise UserInputError("give exactly one of --tiny or --model PATH")
    if opts["tiny"]:
        from llds.models import tiny_causal_lm_for

        if not (corpus and Path(corpus).is_file()):
            raise UserInputError(
                "--tiny fits its tokenizer to a corpus: give --world or a --corpus .jsonl file"
            )
        tok = tiny_tokenizer(
            corpus,
            train,
            opts["tokenizer_vocab"],
            template=template,
            name_tokens=opts["name_tokens"],
        )
        model = tiny_causal_lm_for(
            tok,
            hidden_size=opts["hidden"],
            num_layers=opts["layers"],
            num_heads=opts["heads"],
            num_kv_heads=max(1, opts["heads"] // 2),
            seed=opts["seed"],
        )
        return model.to(opts["device"]), tok
    if opts["model"] == "smollm2":
        from llds.models import load_smollm2

        return load_smollm2(device=opts["device"])
    from llds.models import load_policy

    return load_policy(opts["model"], device=opts["device"])


def _relabeled_copies(opts: dict[str, Any]) -> list[tuple[list[Any], Any]]:
    """(train questions, retriever) of each `--relabel-copies` copy of the `--world`."""
    k = opts["relabel_copies"] or 0
    if k < 0:
        raise ConfigError(f"relabel_copies must be >= 0, got {k}")
    if not k:
        return []
    if not opts["world"]:
        raise UserInputError("--relabel-copies needs --world (it permutes the world's names)")
    from llds.data.world import read_world, relabel_world
    from llds.retrieval.bm25 import BM25Retriever

    world = read_world(opts["world"])
    copies = [relabel_world(world, seed=opts["seed"] * 1000 + 1 + i) for i in range(k)]
    return [(c.train, BM25Retriever.build(c.corpus, show_progress=False)) for c in copies]


def run(args: argparse.Namespace) -> int:
    import json

    opts = resolve_options(args)
    if opts["threads"]:
        import torch

        torch.set_num_threads(opts["threads"])
    started = time.perf_counter()
    train, test, world_corpus = _load_examples(opts)
    corpus = opts["corpus"] or world_corpus
    if corpus is None:
        raise UserInputError("--data needs --corpus (a corpus .jsonl, index dir or URL)")

    from llds.env.prompts import PromptTemplate
    from llds.io import write_json
    from llds.retrieval.factory import open_retriever
    from llds.train.sft import sft_train
    from llds.train.sft_data import build_expert_episodes

    template = (
        PromptTemplate.from_file(opts["prompt_template"]) if opts["prompt_template"] else None
    )
    model, tok = _model_and_tokenizer(opts, corpus, template, train)
    retriever = open_retriever(corpus)
    expert = {
        "template": template,
        "chat": opts["chat"],
        "topk": opts["topk"],
        "max_obs_tokens": opts["max_obs_tokens"],
        "think": not opts["no_think"],
        "max_hops": opts["max_hops"],
        "num_examples": opts["num_examples"],
        "early_answer": opts["early_answer"],
        "seed": opts["seed"],
    }
    episodes, stats = build_expert_episodes(train, retriever, tok, **expert)
    for copy_train, copy_retriever in _relabeled_copies(opts):
        more, more_stats = build_expert_episodes(copy_train, copy_retriever, tok, **expert)
        episodes += more
        stats = stats.merged(more_stats)
    n_params = sum(p.numel() for p in model.parameters())
    mean_len = sum(len(e) for e in episodes) / max(len(episodes), 1)
    print(
        f"{stats.kept} trajectories ({stats.to_dict()['kept_by_hops']} by hops; "
        f"{stats.early_answers} stopping early, "
        f"{stats.skipped_hops} skipped by --max-hops, {stats.skipped_no_gold_in_retrieval} "
        f"without the answer in retrieval), {mean_len:.0f} tokens each on average; "
        f"model {n_params / 1e6:.2f}M parameters"
    )
    out = Path(args.out)
    result = sft_train(
        model,
        tok,
        episodes,
        lr=opts["lr"],
        steps=opts["steps"],
        epochs=opts["epochs"],
        batch_size=opts["batch_size"],
        micro_batch_tokens=opts["micro_batch_tokens"],
        warmup=opts["warmup"],
        seed=opts["seed"],
        out_dir=out,
        progress=not args.no_progress,
        loss_on=opts["loss_on"],
    )
    report: dict[str, Any] = {
        "options": opts,
        "data": stats.to_dict(),
        "parameters": n_params,
        "mean_tokens_per_trajectory": mean_len,
        "initial_loss": result.initial_loss,
        "final_loss": result.final_loss,
        "sft_wall_s": round(result.wall_s, 2),
    }
    from llds.env.protocol import Protocol

    # what `llds eval` / `llds train` need to talk to this model as SFT taught it
    Protocol(
        prompt_template=None if template is None else template.text,
        chat=opts["chat"],
        topk=opts["topk"],
        max_turns=opts["eval_max_turns"],
        max_obs_tokens=opts["max_obs_tokens"],
    ).write(result.model_dir)
    print(
        f"SFT loss {result.initial_loss:.3f} -> {result.final_loss:.3f} in {result.steps} "
        f"steps ({result.wall_s:.0f} s)"
    )
    if opts["eval"] and test:
        from llds.rollout import RolloutConfig
        from llds.train.evaluate import evaluate, results_table

        res = evaluate(
            model,
            tok,
            retriever,
            test[: opts["eval"]],
            RolloutConfig(
                max_turns=opts["eval_max_turns"],
                temperature=0.0,
                topk=opts["topk"],
                max_obs_tokens=opts["max_obs_tokens"],
            ),
            template=template,
            chat=opts["chat"],
            progress=not args.no_progress,
        )
        report["eval"] = {k: res[k] for k in ("overall", "by_hops")}
        print(results_table(res))
    report["total_wall_s"] = round(time.perf_counter() - started, 2)
    write_json(out / "sft_report.json", json.loads(json.dumps(report, default=str)))
    print(f"model written to {result.model_dir}")
    return 0
