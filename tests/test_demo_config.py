"""The demo's training configs and the organism preset pass the config validator."""

import json
from pathlib import Path

from llds.data.world import load_world_config
from llds.demo import DemoConfig, sft_config, training_config, warm_start
from llds.sft import load_sft_config
from llds.train.config import load_config


def test_demo_configs_are_the_organism_preset_plus_overrides(tmp_path):
    organism = load_config("organism")
    for llds in (True, False):
        cfg = training_config(tmp_path / "run", tmp_path, llds=llds, steps=3, seed=1)
        assert cfg.algo.llds.enabled is llds
        assert cfg.llds_can_act  # more than one optimizer step per rollout batch
        assert cfg.model.path == str(tmp_path / "sft" / "model")
        assert (cfg.steps, cfg.seed, cfg.eval_every, cfg.save_every) == (3, 1, 0, 10)
        assert cfg.rollout == organism.rollout and cfg.optim == organism.optim
        assert cfg.algo.llds.coef == organism.algo.llds.coef


def test_demo_warm_start_is_the_sft_demo_preset(tmp_path):
    cfg = sft_config(DemoConfig(layers=1), tmp_path)
    preset = load_sft_config("sft-demo", {"out": "x"})
    assert cfg.layers == 1 and preset.layers == 2  # a demo knob overrides the preset
    assert (cfg.steps, cfg.loss_on, cfg.name_tokens, cfg.think) == (1200, "all", True, False)
    assert cfg.world == str(tmp_path / "world") and cfg.out == str(tmp_path / "sft")


def test_shipped_presets_validate():
    root = Path(__file__).resolve().parents[1] / "src" / "llds" / "configs"
    for path in sorted(root.glob("*.yaml")):  # each kind of preset loads with its own loader
        if path.name.startswith("sft-"):
            assert load_sft_config(path, {"out": "x"}).steps >= 1, path.name
        elif path.name.startswith("world-"):
            assert load_world_config(path).num_train >= 1, path.name
        else:
            assert load_config(path).steps >= 1, path.name
    paper = load_config(root / "search-r1-qwen2.5-3b.yaml")
    assert (paper.rollout.group_size, paper.optim.lr, paper.algo.kl_coef) == (5, 1e-6, 0.001)
    assert (paper.algo.llds.gate, paper.algo.llds.coef, paper.retriever.topk) == ("action", 0.2, 3)
    assert (paper.rollout.max_turns, paper.eval_max_turns) == (3, 4)
    assert (paper.optim.mini_batches, paper.optim.epochs) == (10, 1)
    assert paper.algo.llds.aggregation == "seq-mean-token-mean"
    assert paper.algo.llds.first_update == "zero"
    authors = load_config(root / "search-r1-qwen2.5-3b-authors.yaml")
    assert (authors.optim.mini_batches, authors.optim.epochs) == (10, 1)
    assert authors.algo.llds.aggregation == "token-mean"
    assert authors.algo.llds.first_update == "computed"
    assert authors.algo.entropy_coef == 0.001
    assert authors.warmup_steps == round(0.285 * authors.steps)
    big = load_config(root / "search-r1-qwen2.5-7b.yaml")
    assert big.fsdp.enabled and big.algo.llds.coef == 0.3 and "7B" in big.model.path
    assert not paper.fsdp.enabled
    for preset in (paper, authors, big):  # bf16 compute on float32 master weights
        assert preset.model.dtype == "bfloat16"
        assert (preset.optim.mini_batches, preset.optim.epochs) == (10, 1)


def test_warm_start_trains_on_the_world_and_its_relabeled_copies(tmp_path):
    from rich.console import Console

    cfg = DemoConfig(out=str(tmp_path), relabel_copies=1, sft_steps=2, hidden=32, layers=1)
    warm_start(cfg, tmp_path, Console(quiet=True))
    report = json.loads((tmp_path / "sft" / "sft_report.json").read_text())
    world = json.loads((tmp_path / "world" / "world.json").read_text())
    assert report["data"]["considered"] == 2 * world["stats"]["train"]  # world + one copy
    assert report["options"]["loss_on"] == "all" and report["options"]["name_tokens"] is True
    # the hasty demonstrator: some trajectories stop early, in the world and in the copy
    assert report["options"]["early_answer"] == 0.5
    assert 0 < report["data"]["early_answers"] < report["data"]["kept"]
    assert (tmp_path / "sft" / "model" / "config.json").is_file()


def test_the_demo_evaluates_with_the_organism_preset_rollout():
    """The demo's evaluations read the preset's limits (no restated copy to drift)."""
    from llds.demo import organism_rollout
    from llds.train.config import load_config

    preset = load_config("organism")
    got = organism_rollout()
    assert got.topk == preset.retriever.topk == 2
    for key in ("max_turns", "max_turn_tokens", "max_obs_tokens", "max_total_tokens"):
        assert getattr(got, key) == getattr(preset.rollout, key)
    assert (got.max_turns, got.max_turn_tokens, got.max_total_tokens) == (3, 48, 768)
