"""The rollout engine against the protocol rules, on a real tiny model and a real BM25 index."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import make_tiny_model, rollout_requests, tag_happy
from llds.env.actions import parse_action
from llds.env.observation import information_block, invalid_action_message
from llds.env.prompts import build_prompt_ids
from llds.env.rewards import FormatRewardConfig, exact_match
from llds.rollout import RolloutConfig, RolloutEngine, RolloutRequest


def _generate(model, tok, retriever, reqs, seed=0, **cfg):
    base = dict(max_turns=2, max_turn_tokens=24, max_obs_tokens=48, max_total_tokens=320, topk=2)
    base.update(cfg)
    engine = RolloutEngine(model, tok, retriever, RolloutConfig(**base))
    gen = torch.Generator().manual_seed(seed)
    return engine.generate(reqs, generator=gen), engine


@pytest.fixture(scope="module")
def happy_batch(small_world, world_tokenizer, world_retriever):
    model = tag_happy(make_tiny_model(world_tokenizer, seed=1), world_tokenizer)
    reqs = rollout_requests(small_world, world_tokenizer, n=24)
    batch, engine = _generate(model, world_tokenizer, world_retriever, reqs)
    return batch, engine, model, reqs


def test_every_branch_is_exercised(happy_batch):
    batch, *_ = happy_batch
    reasons = {e.stop_reason for e in batch.episodes}
    assert sum(e.num_valid_searches for e in batch.episodes) > 0
    assert sum(e.num_invalid for e in batch.episodes) > 0
    assert "answer" in reasons


def test_token_layout_matches_the_protocol(happy_batch, world_tokenizer, world_retriever):
    batch, engine, _, reqs = happy_batch
    tok = world_tokenizer
    cfg = engine.config
    for row, (ep, req) in enumerate(zip(batch.episodes, reqs, strict=True)):
        assert ep.prompt_ids == req.prompt_ids and ep.group_id == req.group_id
        # split the response into alternating action / observation runs
        runs, cur, kind = [], [], None
        for tid, m in zip(ep.response_ids, ep.action_mask, strict=True):
            if kind is not None and m != kind:
                runs.append((kind, cur))
                cur = []
            kind = m
            cur.append(tid)
        if cur:
            runs.append((kind, cur))
        actions = [ids for k, ids in runs if k == 1]
        observations = [ids for k, ids in runs if k == 0]
        assert [tok.decode(a) for a in actions] == ep.action_texts
        assert len(actions) == ep.num_turns <= cfg.max_turns + 1
        assert ep.num_valid_searches <= cfg.max_turns
        assert len(ep.prompt_ids) + len(ep.response_ids) <= cfg.max_total_tokens
        # each observation is exactly what the environment owes the preceding action
        search_i = 0
        for a_ids, o_ids in zip(actions, observations, strict=False):
            action = parse_action(tok.decode(a_ids))
            if action.kind == "search":
                hits = world_retriever.search([action.content], cfg.topk)[0]
                expected = information_block(hits, tokenizer=tok, max_tokens=cfg.max_obs_tokens)
                assert ep.queries[search_i] == action.content
                search_i += 1
            else:
                assert action.kind == "invalid"
                expected = invalid_action_message()
            want = tok(expected, add_special_tokens=False)["input_ids"]
            assert o_ids == want[: len(o_ids)] and len(o_ids) >= 1
        assert search_i == ep.num_valid_searches
        # padded tensors agree with the episode
        p = batch.prompt_len
        n = len(ep.response_ids)
        assert batch.input_ids[row, p : p + n].tolist() == ep.response_ids
        assert batch.loss_mask[row, :n].tolist() == [bool(m) for m in ep.action_mask]
        assert not batch.loss_mask[row, n:].any()


def test_rewards_and_answer_span(happy_batch, world_tokenizer):
    batch, *_ = happy_batch
    for row, ep in enumerate(batch.episodes):
        # only the last turn's answer action is scored
        action = parse_action(ep.action_texts[-1])
        pred = action.content if action.kind == "answer" else None
        assert (action.kind == "answer") == (ep.stop_reason == "answer")
        assert ep.answer == pred
        assert ep.em == exact_match(pred, ep.golds) == batch.rewards[row].item()
        span = [t for t, m in zip(ep.response_ids, ep.answer_mask, strict=True) if m]
        if ep.stop_reason == "answer":
            text = world_tokenizer.decode(span)
            assert text.startswith("<answer>") and text.endswith("</answer>")
        else:
            assert not span


def _eos_happy(model, tok, bias: float):
    """Bias a tag-happy model towards end-of-sequence too, so turns would end very early."""
    head = model.get_output_embeddings()
    with torch.no_grad():
        head.bias[tok.eos_token_id] = bias
    return model


def _eos_turns_that_go_on(ep, eos_id) -> int:
    """Turns that ended with the end-of-sequence token and were followed by an observation."""
    ids, mask = ep.response_ids, ep.action_mask
    return sum(
        1 for k in range(len(ids) - 1) if ids[k] == eos_id and mask[k] == 1 and mask[k + 1] == 0
    )


def test_kv_reuse_gives_the_same_rollouts_with_less_prefill(
    small_world, world_tokenizer, world_retriever
):
    tok = world_tokenizer
    model = _eos_happy(tag_happy(make_tiny_model(tok, seed=2), tok), tok, bias=3.0)
    reqs = rollout_requests(small_world, tok, n=12)
    a, ea = _generate(model, tok, world_retriever, reqs, kv_reuse=True)
    b, eb = _generate(model, tok, world_retriever, reqs, kv_reuse=False)
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.loss_mask, b.loss_mask)
    assert torch.equal(a.answer_mask, b.answer_mask)
    assert torch.equal(a.rewards, b.rewards)
    facts = ("stop_reason", "num_turns", "num_invalid", "num_valid_searches", "context_capped")
    for x, y in zip(a.episodes, b.episodes, strict=True):
        assert [getattr(x, f) for f in facts] == [getattr(y, f) for f in facts]
    # EOS-ended turns occurred and the rollout went on after them (an observation follows),
    # in the middle of the context that the KV cache carries across turns
    assert sum(_eos_turns_that_go_on(e, tok.eos_token_id) for e in a.episodes) >= 2
    assert sum(e.num_valid_searches for e in a.episodes) > 0
    assert ea.stats["prefill_tokens"] < eb.stats["prefill_tokens"]


def test_batched_greedy_equals_one_row_at_a_time(small_world, world_tokenizer, world_retriever):
    model = tag_happy(make_tiny_model(world_tokenizer, seed=4), world_tokenizer, bias=3.0)
    reqs = rollout_requests(small_world, world_tokenizer, n=6, group=1)
    together, _ = _generate(model, world_tokenizer, world_retriever, reqs, temperature=0.0)
    for i, req in enumerate(reqs):
        alone, _ = _generate(model, world_tokenizer, world_retriever, [req], temperature=0.0)
        assert alone.episodes[0].response_ids == together.episodes[i].response_ids


def test_max_rows_chunks_keep_order_and_count(small_world, world_tokenizer, world_retriever):
    model = make_tiny_model(world_tokenizer, seed=5)
    reqs = rollout_requests(small_world, world_tokenizer, n=7, group=1)
    batch, _ = _generate(
        model,
        world_tokenizer,
        world_retriever,
        reqs,
        max_rows=3,
        temperature=0.0,
        max_turns=1,
        max_turn_tokens=8,
    )
    assert [e.example_id for e in batch.episodes] == [r.example_id for r in reqs]
    assert len(batch) == 7


def test_select_trims_padding(happy_batch):
    batch, *_ = happy_batch
    sub = batch.select([0, 3])
    for j, i in enumerate([0, 3]):
        full = batch.input_ids[i][batch.attention_mask[i].bool()]
        part = sub.input_ids[j][sub.attention_mask[j].bool()]
        assert torch.equal(full, part)
    assert sub.attention_mask[:, 0].any() and sub.attention_mask[:, -1].any()


def test_seeded_rollouts_do_not_depend_on_batch_mates(
    small_world, world_tokenizer, world_retriever
):
    model = tag_happy(make_tiny_model(world_tokenizer, seed=6), world_tokenizer)
    base = rollout_requests(small_world, world_tokenizer, n=6, group=2)
    reqs = [dataclasses.replace(r, seed=100 + i) for i, r in enumerate(base)]
    together, _ = _generate(model, world_tokenizer, world_retriever, reqs)
    shuffled = [reqs[i] for i in (4, 1, 5, 0, 3, 2)]
    chunked, _ = _generate(model, world_tokenizer, world_retriever, shuffled, max_rows=2)
    by_seed = {r.seed: e.response_ids for r, e in zip(shuffled, chunked.episodes, strict=True)}
    for r, e in zip(reqs, together.episodes, strict=True):
        assert by_seed[r.seed] == e.response_ids
    # and the samples really are random: different seeds, different rollouts
    assert len({tuple(e.response_ids) for e in together.episodes}) > 1


def test_single_turn_without_retriever_gives_fixed_length_turns(small_world, world_tokenizer):
    tok = world_tokenizer
    model = _eos_happy(tag_happy(make_tiny_model(tok, seed=7), tok, bias=6.0), tok, bias=6.0)
    reqs = rollout_requests(small_world, tok, n=12)
    free, _ = _generate(model, tok, None, reqs, max_turns=0, max_turn_tokens=16)
    lengths = [len(e.response_ids) for e in free.episodes]
    assert min(lengths) < 16  # without a minimum, EOS and stop tags end turns early
    fixed, engine = _generate(
        model, tok, None, reqs, max_turns=0, max_turn_tokens=16, min_turn_tokens=16
    )
    assert engine.retriever is None
    for ep in fixed.episodes:
        assert len(ep.response_ids) == 16 and all(ep.action_mask)
        assert tok.eos_token_id not in ep.response_ids
        assert ep.num_turns == 1 and ep.num_valid_searches == 0 and not ep.retrieved_ids
    assert any(
        "</search>" in e.response_text or "</answer>" in e.response_text for e in fixed.episodes
    )  # stop tags were sampled but did not end the turn


def test_min_turn_tokens_only_delays_the_end(small_world, world_tokenizer):
    tok = world_tokenizer
    model = _eos_happy(tag_happy(make_tiny_model(tok, seed=8), tok, bias=6.0), tok, bias=6.0)
    reqs = rollout_requests(small_world, tok, n=9)
    batch, _ = _generate(model, tok, None, reqs, max_turns=0, max_turn_tokens=24, min_turn_tokens=5)
    lengths = [len(e.response_ids) for e in batch.episodes]
    assert min(lengths) >= 5 and min(lengths) < 24  # ends after the minimum, not only at the cap
    assert all(tok.eos_token_id not in e.response_ids[:4] for e in batch.episodes)


def test_searching_needs_a_retriever_and_a_sane_minimum(world_tokenizer):
    from llds.errors import ConfigError

    model = make_tiny_model(world_tokenizer)
    with pytest.raises(ConfigError, match="needs a retriever"):
        RolloutEngine(model, world_tokenizer, None, RolloutConfig(max_turns=1))
    with pytest.raises(ConfigError, match="min_turn_tokens"):
        RolloutConfig(max_turn_tokens=8, min_turn_tokens=9).validate()


def test_rollout_log_probs_equal_the_trainers_recompute(
    small_world, world_tokenizer, world_retriever
):
    """The engine's log pi / entropy of each sampled token, taken from the logits it sampled
    from, are the unfiltered policy at the sampling temperature: what the trainer recomputes,
    even though top-k / top-p / the EOS ban of `min_turn_tokens` shaped the sampling."""
    from llds.policy.forward import batched_log_probs

    tok = world_tokenizer
    model = _eos_happy(tag_happy(make_tiny_model(tok, seed=9), tok), tok, bias=3.0)
    base = rollout_requests(small_world, tok, n=12, group=3)
    reqs = [dataclasses.replace(r, seed=500 + i) for i, r in enumerate(base)]
    temp = 0.7
    batch, _ = _generate(
        model,
        tok,
        world_retriever,
        reqs,
        temperature=temp,
        top_k=8,
        top_p=0.9,
        min_turn_tokens=3,
    )
    assert batch.rollout_logprobs is not None and batch.rollout_entropy is not None
    assert batch.rollout_logprobs.shape == batch.loss_mask.shape
    assert sum(e.num_valid_searches for e in batch.episodes) > 0  # observations in between
    act = batch.loss_mask
    assert (batch.rollout_logprobs[~act] == 0).all() and (batch.rollout_entropy[~act] == 0).all()
    model.eval()
    lp, ent = batched_log_probs(model, batch, 10**6, temperature=temp, with_entropy=True)
    assert torch.allclose(batch.rollout_logprobs[act], lp[act], atol=1e-4)
    assert torch.allclose(batch.rollout_entropy[act], ent[act], atol=1e-4)
    # top-k 8 renormalizes: the filtered distribution's log-probs would be visibly larger
    assert float((lp[act].exp() < 0.5).float().mean()) > 0.1

    sub = batch.select([7, 0, 4])
    for j, i in enumerate([7, 0, 4]):
        w = sub.response_len
        assert torch.equal(sub.rollout_logprobs[j], batch.rollout_logprobs[i, :w])
        assert torch.equal(sub.rollout_entropy[j], batch.rollout_entropy[i, :w])
    sub_lp, _ = batched_log_probs(model, sub, 10**6, temperature=temp)
    assert torch.allclose(sub.rollout_logprobs[sub.loss_mask], sub_lp[sub.loss_mask], atol=1e-4)


def test_groups_share_one_prefill_with_unchanged_rollouts(
    small_world, world_tokenizer, world_retriever
):
    tok = world_tokenizer
    model = tag_happy(make_tiny_model(tok, seed=10), tok)
    base = rollout_requests(small_world, tok, n=8, group=4)
    reqs = [dataclasses.replace(r, seed=900 + i) for i, r in enumerate(base)]
    grouped, eg = _generate(model, tok, world_retriever, reqs, max_turns=1)
    alone, ea = _generate(model, tok, world_retriever, reqs, max_turns=1, max_rows=1)
    for a, b in zip(grouped.episodes, alone.episodes, strict=True):
        assert a.response_ids == b.response_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    prompts = sum(len(r.prompt_ids) for r in reqs)
    assert ea.stats["prefill_tokens"] - eg.stats["prefill_tokens"] == prompts * 3 // 4


# --- scripted rollouts: every token chosen by hand -------------------------------------------


class ScriptedLM(torch.nn.Module):
    """A real tiny model (so the key/value cache is real) whose next-token choice is a script.

    `script` is the whole expected response, observations included: the logits predicting
    response position k put all the mass on `script[k]` (EOS past its end). Greedy decoding then
    writes the script's action tokens, and the environment must supply exactly the script's
    observation tokens for the positions to stay aligned.
    """

    def __init__(self, inner, prompt_len: int, script: list[int], eos_id: int) -> None:
        super().__init__()
        self.inner = inner
        self.prompt_len = prompt_len
        self.script = list(script)
        self.eos_id = eos_id

    def forward(self, input_ids, attention_mask, position_ids, **kwargs):
        out = self.inner(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
        )
        vocab = out.logits.shape[-1]
        logits = torch.zeros(input_ids.shape[0], 1, vocab, device=out.logits.device)
        for row, k in enumerate((position_ids[:, -1] + 1 - self.prompt_len).tolist()):
            logits[row, 0, self.script[k] if 0 <= k < len(self.script) else self.eos_id] = 30.0
        out.logits = logits
        return out


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _scripted(world, tok, retriever, script, *, format_reward=None, **cfg):
    """One greedy rollout of `script` for the first training question; returns its episode."""
    q = world.train[0]
    prompt = build_prompt_ids(tok, q.question, "Question: {question}\n")
    model = ScriptedLM(make_tiny_model(tok, seed=0), len(prompt), script, tok.eos_token_id)
    base = dict(
        max_turns=2,
        max_turn_tokens=24,
        max_obs_tokens=48,
        max_total_tokens=1000,
        topk=2,
        temperature=0.0,
    )
    base.update(cfg)
    engine = RolloutEngine(
        model, tok, retriever, RolloutConfig(**base), format_reward=format_reward
    )
    batch = engine.generate([RolloutRequest(prompt, q.id, q.id, q.answers)])
    return batch.episodes[0], len(prompt)


def _info(tok, retriever, query, topk=2, max_obs=48) -> list[int]:
    hits = retriever.search([query], topk)[0]
    return _ids(tok, information_block(hits, tokenizer=tok, max_tokens=max_obs))


@pytest.mark.parametrize("kv_reuse", [True, False])
def test_eos_ended_turn_without_action_is_invalid_and_the_rollout_goes_on(
    small_world, world_tokenizer, world_retriever, kv_reuse
):
    """Search-R1: a turn with no complete search/answer span is an invalid action whatever ended
    it, an end-of-sequence token included: corrective message, and the rollout continues."""
    tok = world_tokenizer
    gold = small_world.train[0].answers[0]
    eos = tok.eos_token_id
    t1 = [*_ids(tok, "<think> x"), eos]
    o1 = _ids(tok, invalid_action_message())
    t2 = _ids(tok, "<search> Lisom </search>")
    o2 = _info(tok, world_retriever, "Lisom")
    t3 = _ids(tok, f"<answer> {gold} </answer>")
    ep, _ = _scripted(small_world, tok, world_retriever, t1 + o1 + t2 + o2 + t3, kv_reuse=kv_reuse)

    assert ep.response_ids == t1 + o1 + t2 + o2 + t3  # the EOS id is kept in the action
    runs = [(t1, 1), (o1, 0), (t2, 1), (o2, 0), (t3, 1)]
    assert ep.action_mask == [m for ids, m in runs for _ in ids]
    assert ep.action_texts == [tok.decode(t, skip_special_tokens=False) for t in (t1, t2, t3)]
    assert ep.action_texts[0] == "<think> x<|endoftext|>"
    assert (ep.num_turns, ep.num_invalid, ep.num_valid_searches) == (3, 1, 1)
    assert ep.queries == ["Lisom"] and ep.stop_reason == "answer"
    assert ep.answer == gold and (ep.em, ep.reward) == (1.0, 1.0)
    n = len(ep.response_ids)
    assert ep.answer_mask == [0] * (n - len(t3)) + [1] * len(t3)
    assert not ep.context_capped


@pytest.mark.parametrize("kv_reuse", [True, False])
def test_eos_ended_turn_with_a_complete_search_executes_it(
    small_world, world_tokenizer, world_retriever, kv_reuse
):
    """A search closed more than the stop checker's tail before the turn's end (possible with
    `min_turn_tokens`) and then EOS: the search is executed, it does not end the rollout."""
    tok = world_tokenizer
    eos = tok.eos_token_id
    search = _ids(tok, "<search> Lisom </search>")
    filler = _ids(tok, " x") * 20  # > TAIL_TOKENS: the stop check no longer sees </search>
    t1 = [*search, *filler, eos]
    o1 = _info(tok, world_retriever, "Lisom")
    t2 = (_ids(tok, " y") * len(t1))[: len(t1)]  # the last turn, ended by the per-turn cap
    ep, _ = _scripted(
        small_world,
        tok,
        world_retriever,
        t1 + o1 + t2,
        kv_reuse=kv_reuse,
        max_turns=1,
        max_turn_tokens=len(t1),
        min_turn_tokens=len(t1) - 1,
    )
    assert ep.response_ids == t1 + o1 + t2
    assert ep.action_mask == [1] * len(t1) + [0] * len(o1) + [1] * len(t2)
    assert (ep.num_turns, ep.num_invalid, ep.num_valid_searches) == (2, 0, 1)
    assert ep.queries == ["Lisom"] and ep.stop_reason == "turn_limit"
    assert ep.answer is None and ep.reward == 0.0 and not any(ep.answer_mask)


@pytest.mark.parametrize("with_format", [False, True])
def test_answer_stitched_across_turns_scores_zero(
    small_world, world_tokenizer, world_retriever, with_format
):
    """`<answer> gold` cut by the per-turn cap, corrective message, then ` </answer>`: no turn
    holds a complete answer span, so there is no answer: reward 0, no answer mask."""
    tok = world_tokenizer
    gold = small_world.train[0].answers[0]
    t1 = _ids(tok, f"<answer> {gold}")
    o1 = _ids(tok, invalid_action_message())
    t2 = _ids(tok, " </answer>")
    fmt = FormatRewardConfig(enabled=True) if with_format else None
    ep, _ = _scripted(
        small_world,
        tok,
        world_retriever,
        t1 + o1 + t2,
        format_reward=fmt,
        max_turns=1,
        max_turn_tokens=len(t1),
    )
    assert ep.response_ids == t1 + o1 + t2
    assert "".join(ep.action_texts) == f"<answer> {gold} </answer>"  # what stitching would see
    assert ep.stop_reason == "turn_limit" and ep.num_invalid == 1 and ep.num_turns == 2
    assert ep.answer is None
    assert (ep.reward, ep.em, ep.f1, ep.sub_em) == (0.0, 0.0, 0.0, 0.0)
    assert not ep.valid_format
    assert not any(ep.answer_mask)


def test_valid_format_reads_the_observations(small_world, world_tokenizer, world_retriever):
    """think -> search -> information -> think -> answer is a valid sequence, also when the
    format reward is off (the information block is the environment's, between the turns)."""
    tok = world_tokenizer
    gold = small_world.train[0].answers[0]
    t1 = _ids(tok, "<think> a </think><search> Lisom </search>")
    o1 = _info(tok, world_retriever, "Lisom")
    t2 = _ids(tok, f"<think> b </think><answer> {gold} </answer>")
    ep, _ = _scripted(small_world, tok, world_retriever, t1 + o1 + t2)
    assert ep.response_ids == t1 + o1 + t2 and ep.stop_reason == "answer"
    assert ep.valid_format and ep.em == 1.0
    span = [t for t, m in zip(ep.response_ids, ep.answer_mask, strict=True) if m]
    assert span == _ids(tok, f"<answer> {gold} </answer>")


def test_context_capped(small_world, world_tokenizer, world_retriever):
    tok = world_tokenizer
    gold = small_world.train[0].answers[0]
    chatter = _ids(tok, " x") * 40  # never ends a turn by itself

    # a turn cut by the total cap: 10 tokens fit, the per-turn cap would allow 24
    q = small_world.train[0]
    p = len(build_prompt_ids(tok, q.question, "Question: {question}\n"))
    ep, _ = _scripted(small_world, tok, world_retriever, chatter, max_total_tokens=p + 10)
    assert ep.response_ids == chatter[:10] and ep.num_turns == 1
    assert ep.stop_reason == "context_limit" and ep.context_capped

    # the same 10 tokens cut by the per-turn cap, with room to spare: not capped
    ep, _ = _scripted(small_world, tok, world_retriever, chatter, max_turns=0, max_turn_tokens=10)
    assert ep.response_ids == chatter[:10]
    assert ep.stop_reason == "turn_limit" and not ep.context_capped

    # an observation truncated by the total cap: 7 of its tokens fit, then no room for a turn
    t1 = _ids(tok, "<search> Lisom </search>")
    o1 = _info(tok, world_retriever, "Lisom")
    assert len(o1) > 7
    ep, _ = _scripted(small_world, tok, world_retriever, t1 + o1, max_total_tokens=p + len(t1) + 7)
    assert ep.response_ids == t1 + o1[:7]
    assert ep.action_mask == [1] * len(t1) + [0] * 7
    assert ep.num_turns == 1 and ep.action_texts == ["<search> Lisom </search>"]
    assert ep.num_valid_searches == 1 and ep.stop_reason == "context_limit" and ep.context_capped

    # a complete search that fills the context exactly: no room to run it
    ep, _ = _scripted(small_world, tok, world_retriever, t1, max_total_tokens=p + len(t1))
    assert ep.response_ids == t1 and ep.num_valid_searches == 0 and ep.queries == []
    assert ep.stop_reason == "context_limit" and ep.context_capped

    # an answer that fills the context exactly: it fits, nothing was cut
    t1 = _ids(tok, f"<answer> {gold} </answer>")
    ep, _ = _scripted(small_world, tok, world_retriever, t1, max_total_tokens=p + len(t1))
    assert ep.response_ids == t1 and ep.stop_reason == "answer" and ep.em == 1.0
    assert not ep.context_capped


# --- the LLDS-MA answer span ------------------------------------------------------------------


def test_answer_token_span_is_the_answer_action_of_the_turn(world_tokenizer):
    from llds.rollout.spans import answer_token_span

    tok = world_tokenizer
    # the orphan `</answer>` is skipped; the first complete span decides, as in parse_action
    ids = _ids(tok, "Rome </answer> <answer> Rokror </answer> <answer> Paris </answer>")
    start, end = answer_token_span(tok, ids)
    assert tok.decode(ids[start:end]) == "<answer> Rokror </answer>"
    assert start == len(_ids(tok, "Rome </answer> "))
    # a turn whose action is a search, or with only the closing half of an answer: no span
    assert answer_token_span(tok, _ids(tok, "<answer> a <search> q </search> b </answer>")) is None
    assert answer_token_span(tok, _ids(tok, " Rokror </answer>")) is None


def test_mark_answer_span_reads_only_a_final_answer_action(world_tokenizer):
    from llds.rollout.batch import Episode
    from llds.rollout.spans import mark_answer_span

    tok = world_tokenizer
    obs = _ids(tok, invalid_action_message())

    def episode(stop_reason, *turns):
        ep = Episode(prompt_ids=[1, 2], example_id="e", group_id="g", golds=("Rokror",))
        for k, turn in enumerate(turns):
            if k:
                ep.append(obs, action=False)
            ep.append(_ids(tok, turn), action=True, logprobs=None, entropies=None)
        ep.stop_reason = stop_reason
        mark_answer_span(ep, tok)
        return ep

    answer = "<answer> Rokror </answer>"
    ep = episode("answer", "<think> a", answer)
    n, k = len(ep.response_ids), len(_ids(tok, answer))
    assert ep.answer_mask == [0] * (n - k) + [1] * k
    # a complete span in the last turn that did not end the rollout as an answer: no mask
    assert not any(episode("turn_limit", "<think> a", answer).answer_mask)
    # an answer opened in one turn and closed in the next: no mask, whatever the stop reason
    assert not any(episode("answer", "<answer> Rokror", " </answer>").answer_mask)
