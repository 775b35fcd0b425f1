"""A loss term added through the public registry trains: one function, one config entry."""

from __future__ import annotations

import torch

from conftest import tiny_trainer
from llds.algo import AlgoConfig, TermInputs, aggregate, register_loss_term
from llds.algo.objective import registered_loss_terms

CALLS: list[float] = []


def pull_to_old(x: TermInputs, algo: AlgoConfig):
    """A toy term: coef * mean over model tokens of (log pi - log pi_old)^2."""
    value = aggregate((x.log_probs - x.old_log_probs) ** 2, x.loss_mask, "token-mean")
    CALLS.append(algo.extra_terms["pull_to_old"])
    return algo.extra_terms["pull_to_old"] * value, {"toy/pull_to_old": value.detach()}


if "pull_to_old" not in registered_loss_terms():
    register_loss_term("pull_to_old")(pull_to_old)


def _one_step(tmp_path, world, tok, retriever, extra):
    trainer = tiny_trainer(tmp_path, world, tok, retriever, ["steps=1", *extra])
    trainer.train()
    return [p.detach().clone() for p in trainer.model.parameters()]


def test_a_registered_term_trains_one_step(tmp_path, small_world, world_tokenizer, world_retriever):
    CALLS.clear()
    plain = _one_step(tmp_path / "plain", small_world, world_tokenizer, world_retriever, [])
    assert CALLS == []  # registered but not configured: not called
    toy = _one_step(
        tmp_path / "toy",
        small_world,
        world_tokenizer,
        world_retriever,
        ["algo.extra_terms={pull_to_old: 50.0}"],
    )
    assert CALLS and set(CALLS) == {50.0}  # called on every micro-batch, with its coefficient
    # the first mini-batch has pi_theta == pi_old (the term and its gradient are 0); the second
    # sees a moved policy, so the term changes that update and the weights differ
    assert any(not torch.equal(a, b) for a, b in zip(plain, toy, strict=True))


TERM_FILE = """
from llds.algo import aggregate, register_loss_term
from llds.algo.objective import registered_loss_terms

def file_term(x, algo):
    value = aggregate((x.log_probs - x.old_log_probs) ** 2, x.loss_mask, "token-mean")
    return algo.extra_terms["from_a_file"] * value, {"toy/from_a_file": value.detach()}

if "from_a_file" not in registered_loss_terms():
    register_loss_term("from_a_file")(file_term)
"""


def test_llds_train_loads_the_module_that_registers_a_term(
    tmp_path, small_world, world_tokenizer, capsys
):
    """`algo.term_modules` is imported before the loss is built, so `llds train` itself can
    use a term defined in the user's own file; a missing module is one line naming the key."""
    from conftest import write_run_inputs
    from llds.cli import main

    cfg = write_run_inputs(tmp_path, small_world, world_tokenizer, steps=1, save_every=1)
    module = tmp_path / "my_terms.py"
    module.write_text(TERM_FILE, encoding="utf-8")
    run = ["train", "--config", str(cfg), f"run_dir={tmp_path / 'run'}"]
    terms = "algo.extra_terms={from_a_file: 5.0}"
    assert main([*run, terms, f"algo.term_modules=[{module}]"]) == 0
    row = (tmp_path / "run" / "metrics.jsonl").read_text(encoding="utf-8")
    assert '"loss/from_a_file"' in row and '"toy/from_a_file"' in row
    capsys.readouterr()
    missing = tmp_path / "no_such_terms.py"
    assert main([*run, "--no-resume", terms, f"algo.term_modules=[{missing}]"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"llds train: error: algo.term_modules: {missing} does not exist"
    assert main([*run, "--no-resume", terms, "algo.term_modules=[no_such_module_xyz]"]) == 2
    assert "algo.term_modules: cannot import 'no_such_module_xyz'" in capsys.readouterr().err
