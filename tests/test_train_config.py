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
    with pytest.raises(ConfigError, match=r"algo\.llds\.cof"):
        load_config(None, [*REQUIRED, "algo.llds.cof=0.3"])


def test_bad_type_is_named():
    with pytest.raises(ConfigError, match=r"rollout\.max_turns: expected an integer"):
        load_config(None, [*REQUIRED, "rollout.max_turns=three"])
    with pytest.raises(ConfigError, match=r"algo\.kl_kind"):
        load_config(None, [*REQUIRED, "algo.kl_kind=k7"])


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
    with pytest.raises(ConfigError, match=r"bad\.yaml"):
        load_config(bad)


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
    cfg = load_config(None, [*REQUIRED, "data.prompt_template=Q: {question}", "model.path=123"])
    assert cfg.data.prompt_template == "Q: {question}"
    assert cfg.model.path == "123"
    cfg = load_config(None, [*REQUIRED, "data.prompt_template=null"])
    assert cfg.data.prompt_template is None
