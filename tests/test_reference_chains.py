"""Fixed reference chains: the `lld/ref_*` metrics by hand, the file round trip, and in the
trainer: built once at step 0, read back on a resume, measured against a plain forward pass, and
without effect on training."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import TRAIN_BASE as BASE
from conftest import tiny_trainer
from llds import metrics as keys
from llds.errors import ConfigError, DataFormatError
from llds.probe.reference import REFERENCE_FILE, ReferenceChains, reference_metrics
from llds.rollout.batch import Episode
from llds.train.config import load_config


def test_reference_metrics_by_hand() -> None:
    start = [-5.0, -5.0, -5.0, -5.0, -2.0]
    now = [-6.0, -5.0, -4.0, -7.0, -1.5]
    correct = [True, True, False, False, False]
    m = reference_metrics(start, now, correct)
    # correct: changes -1, 0 -> median -0.5, both <= 0; wrong: +1, -2, +0.5 -> median +0.5
    assert m[keys.REF_CORRECT_CHANGE] == pytest.approx(-0.5)
    assert m[keys.REF_CORRECT_FELL] == pytest.approx(1.0)
    assert m[keys.REF_WRONG_CHANGE] == pytest.approx(0.5)
    assert m[keys.REF_WRONG_FELL] == pytest.approx(1 / 3)
    only_wrong = reference_metrics([-1.0], [-2.0], [False])
    assert set(only_wrong) == {keys.REF_WRONG_CHANGE, keys.REF_WRONG_FELL}


def _chains() -> ReferenceChains:
    episodes = [
        Episode([1, 2], "a", "a", (), [5, 6, 7], action_mask=[1, 0, 1], answer_mask=[0, 0, 0]),
        Episode([3], "b", "b", (), [8], action_mask=[1], answer_mask=[0]),
    ]
    return ReferenceChains(episodes, [True, False], [-3.5, -1.25])


def test_file_round_trip_keeps_tokens_masks_and_start(tmp_path) -> None:
    chains = _chains()
    chains.write(tmp_path / REFERENCE_FILE)
    back = ReferenceChains.read(tmp_path / REFERENCE_FILE)
    assert back.correct == [True, False] and back.start == [-3.5, -1.25]
    a, b = chains.batch(pad_id=0), back.batch(pad_id=0)
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.loss_mask, b.loss_mask)


def test_a_damaged_file_is_named(tmp_path) -> None:
    bad = tmp_path / REFERENCE_FILE
    bad.write_text(json.dumps({"format": 1, "chains": [{"id": "a"}]}))
    with pytest.raises(DataFormatError, match=REFERENCE_FILE):
        ReferenceChains.read(bad)
    bad.write_text("{not json")
    with pytest.raises(DataFormatError, match=REFERENCE_FILE):
        ReferenceChains.read(bad)


def test_reference_needs_held_out_questions() -> None:
    with pytest.raises(ConfigError, match=r"diagnostics\.reference_every"):
        load_config(None, [*BASE, "diagnostics.reference_every=1"])


def _trainer(tmp_path, world, tok, retriever, extra=(), resume=False):
    over = ["data.eval=unused", *extra]
    return tiny_trainer(
        tmp_path, world, tok, retriever, over, resume=resume, eval_examples=world.test
    )


def _plain_log_likelihoods(model, chains: ReferenceChains, pad_id: int) -> list[float]:
    """An independent reading: each chain alone, unpadded, full logits, log-softmax, gather."""
    out = []
    with torch.no_grad():
        for ep in chains.episodes:
            ids = torch.tensor([ep.prompt_ids + ep.response_ids])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
            token_lp = logp.gather(1, ids[0, 1:, None])[:, 0][len(ep.prompt_ids) - 1 :]
            out.append(float((token_lp * torch.tensor(ep.action_mask)).sum()))
    return out


def test_trainer_builds_once_measures_right_and_leaves_training_unchanged(
    tmp_path, small_world, world_tokenizer, world_retriever
) -> None:
    params = {}
    for name, extra in (("off", []), ("on", ["diagnostics.reference_every=1"])):
        tr = _trainer(
            tmp_path / name,
            small_world,
            world_tokenizer,
            world_retriever,
            ["steps=2", "save_every=1", *extra],
        )
        if name == "on":
            chains = tr.reference
            assert chains is not None and len(chains.episodes) == len(small_world.test)
            # at step 0 the start is the starting policy's own reading
            start = _plain_log_likelihoods(tr.rollout_model, chains, tr.engine.pad_id)
            assert chains.start == pytest.approx(start, abs=1e-4)
        rows = tr.train()
        params[name] = [p.detach().clone() for p in tr.model.parameters()]
        if name == "off":
            assert keys.REF_WRONG_CHANGE not in rows[0]
            continue
        now = _plain_log_likelihoods(tr.rollout_model, chains, tr.engine.pad_id)
        expected = reference_metrics(chains.start, now, chains.correct)
        assert expected  # at least one side has chains
        for key, value in expected.items():
            assert rows[-1][key] == pytest.approx(value, abs=1e-4)
        assert any(rows[-1][k] != 0 for k in expected if k.endswith("_change"))
    assert all(torch.equal(a, b) for a, b in zip(params["off"], params["on"], strict=True))

    # a resume reads the chains of step 0 back instead of building new ones from its weights
    written = (tmp_path / "on" / REFERENCE_FILE).read_text()
    resumed = _trainer(
        tmp_path / "on",
        small_world,
        world_tokenizer,
        world_retriever,
        ["steps=3", "save_every=1", "diagnostics.reference_every=1"],
        resume=True,
    )
    assert resumed.step == 2
    assert resumed.reference is not None and resumed.reference.start == chains.start
    assert (tmp_path / "on" / REFERENCE_FILE).read_text() == written
