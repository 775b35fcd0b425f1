import pytest

from llds.config.loader import parse_overrides
from llds.errors import ConfigError
from llds.train.config import TrainConfig, load_config

REQUIRED = ["model.path=m", "data.train=t.jsonl", "retriever.source=c.jsonl"]


def test_yaml_plus_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("steps: 7\nalgo:\n  llds:\n    coef: 0.1\n  kl_coef: 0.0\noptim:\n  lr: 1e-5\n")
    cfg = load_config(f, [*REQUIRED, "algo.llds.coef=0.3", "rollout.group_size=4"])
    assert isinstance(cfg, TrainConfig)
    assert cfg.steps == 7 and cfg.algo.llds.coef == 0.3 and cfg.algo.kl_coef == 0.0
    assert cfg.optim.lr == 1e-5  # YAML 1.1 reads 1e-5 as a string; floats accept it
    assert cfg.rollout.group_size == 4
    assert cfg.algo.llds.gate == "action"  # defaults survive partial sections


def test_unknown_key_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"algo\.llds\.cof: unknown key \(did you mean coef\?\)"):
        load_config(None, [*REQUIRED, "algo.llds.cof=0.3"])
    f = tmp_path / "typo.yaml"
    f.write_text("optim:\n  learning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=rf"^{f}: optim\.learning_rate: unknown key"):
        load_config(f, REQUIRED)


def test_bad_type_is_named():
    with pytest.raises(ConfigError, match=r"rollout\.max_turns: Input should be a valid integer"):
        load_config(None, [*REQUIRED, "rollout.max_turns=three"])
    with pytest.raises(ConfigError, match=r"algo\.kl_kind: Input should be 'k1'.*got 'k7'"):
        load_config(None, [*REQUIRED, "algo.kl_kind=k7"])


def test_errors_name_the_file_that_set_the_key(tmp_path):
    f = tmp_path / "my.yaml"
    f.write_text("optim:\n  lr: -1.0e-5\n")
    with pytest.raises(ConfigError) as err:
        load_config(f, REQUIRED)
    assert str(err.value) == f"{f}: optim.lr: Input should be greater than 0, got -1e-05"
    # the same key from the command line names the command line, not the file
    with pytest.raises(ConfigError, match=r"^command line: optim\.lr: Input should be greater"):
        load_config(f, [*REQUIRED, "optim.lr=0"])
    base = tmp_path / "base.yaml"
    base.write_text("rollout:\n  top_p: 2\n")
    child = tmp_path / "child.yaml"
    child.write_text("base: base.yaml\nsteps: 3\n")
    with pytest.raises(ConfigError, match=rf"^{base}: rollout\.top_p: .*less than or equal to 1"):
        load_config(child, REQUIRED)


def test_ranges_declared_on_the_fields():
    bad = {
        "optim.grad_clip=0": r"optim\.grad_clip: Input should be greater than 0",
        "optim.weight_decay=-0.1": r"optim\.weight_decay: .*greater than or equal to 0",
        "optim.betas=[0.9, 1.0]": r"optim\.betas\[1\]: Input should be less than 1",
        "optim.betas=[0.9]": r"optim\.betas\[1\]: required",
        "eval_every=-1": r"eval_every: .*greater than or equal to 0",
        "threads=0": r"threads: .*greater than or equal to 1",
        "model.lora={rank: 4}": r"model\.lora\.rank: unknown key; valid keys here: r, alpha",
        "model.lora.r=0": r"model\.lora\.r: .*greater than or equal to 1",
        "rollout.top_p=0": r"rollout\.top_p: Input should be greater than 0",
    }
    for override, message in bad.items():
        with pytest.raises(ConfigError, match=rf"^command line: {message}"):
            load_config(None, [*REQUIRED, override])
    cfg = load_config(None, [*REQUIRED, "optim.grad_clip=null", "threads=null"])
    assert cfg.optim.grad_clip is None and cfg.threads is None  # null: no clipping, default
    assert load_config(None, [*REQUIRED, "model.lora={r: 4}"]).model.lora.r == 4


def test_constructed_configs_are_validated_too():
    from llds.rollout.config import RolloutConfig
    from llds.train.config import OptimConfig

    with pytest.raises(ConfigError, match=r"^optim\.lr: Input should be greater than 0"):
        OptimConfig(lr=0.0)
    with pytest.raises(ConfigError, match=r"^rollout\.min_turn_tokens: 9 is more than"):
        RolloutConfig(max_turn_tokens=8, min_turn_tokens=9)
    cfg = load_config(None, REQUIRED)
    with pytest.raises(ValueError, match="greater than 0"):
        cfg.optim.lr = -1.0  # assignments are checked as the loader checks values
    assert TrainConfig().steps == 100  # defaults alone are an object (required keys: loader)


def test_semantic_validation_names_key():
    with pytest.raises(ConfigError, match=r"algo\.llds\.gate"):
        load_config(None, [*REQUIRED, "algo.llds.gate=sequence"])
    with pytest.raises(ConfigError, match=r"model\.path"):
        load_config(None, ["data.train=t", "retriever.source=c"])
    with pytest.raises(ConfigError, match=r"optim\.mini_batches"):
        load_config(
            None, [*REQUIRED, "prompts_per_step=1", "rollout.group_size=2", "optim.mini_batches=3"]
        )


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [1,\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not valid YAML: .*\(line \d+, column"):
        load_config(bad)


def test_a_key_written_twice_in_a_file_is_refused(tmp_path):
    f = tmp_path / "twice.yaml"
    f.write_text("steps: 3\noptim:\n  lr: 1.0e-5\n  mini_batches: 2\n  lr: 2.0e-5\n")
    with pytest.raises(ConfigError) as err:
        load_config(f, REQUIRED)
    assert str(err.value) == f"{f}: line 5: key 'lr' appears twice in one mapping"
    top = tmp_path / "top.yaml"
    top.write_text("steps: 3\nseed: 1\nsteps: 4\n")
    with pytest.raises(ConfigError, match=r"line 3: key 'steps' appears twice"):
        load_config(top, REQUIRED)


def test_override_parsing():
    got = parse_overrides(["a.b=1", "a.c=x: {y}", "d=[1, 2]", "e=null"])
    assert got["a"]["b"].parsed == 1 and got["d"].parsed == [1, 2] and got["e"].parsed is None
    assert got["a"]["c"].raw == "x: {y}"
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["novalue"])


def test_llds_can_act_property():
    cfg = load_config(None, [*REQUIRED, "optim.mini_batches=1", "algo.llds.enabled=false"])
    assert not cfg.llds_can_act  # 1 mini-batch x 1 epoch
    cfg = load_config(None, [*REQUIRED, "optim.mini_batches=2"])
    assert cfg.llds_can_act


def test_string_fields_take_override_text_verbatim():
    cfg = load_config(None, [*REQUIRED, "data.prompt_template=Q: {question}", "model.path=007"])
    assert cfg.data.prompt_template == "Q: {question}"
    assert cfg.model.path == "007"  # YAML would read the integer 7
    cfg = load_config(None, [*REQUIRED, "data.prompt_template=null", "run_dir=a # b"])
    assert cfg.data.prompt_template is None
    assert cfg.run_dir == "a # b"  # YAML would drop the comment
    # YAML 1.1 reads 1e-4 (no dot) as text; a float field still takes it
    assert load_config(None, [*REQUIRED, "optim.lr=1e-4"]).optim.lr == 1e-4


def test_required_keys_are_named_with_the_file(tmp_path):
    f = tmp_path / "partial.yaml"
    f.write_text("data:\n  train: t.jsonl\nretriever:\n  source: c.jsonl\n")
    with pytest.raises(ConfigError) as err:
        load_config(f)
    assert str(err.value) == (
        f"{f}: model.path: required (an HF model directory, hub id, or smollm2)"
    )
    cfg = load_config(None, ["model.path=m", "data.train=t.jsonl", "rollout.max_turns=0"])
    assert cfg.retriever.source == ""  # single-turn training needs no retriever
