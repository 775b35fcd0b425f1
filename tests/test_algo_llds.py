"""LLDS against numbers worked out by hand and against a plain-Python reference."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llds.algo import answer_weight_schedule, llds_loss

# d = old - logp (positive = likelihood fell). Three responses:
#  row 0: A=+1, model tokens at 0,1 (action 0: d=.3,-.1 sum .2 open) and 4,5 (action 1: d=.2,-.5
#         sum -.3 closed); positions 2,3 are an observation.
#  row 1: A=0 (preserving), one action d=.4,.1,-.2 (sum .3 open).
#  row 2: A=-1, never penalized although every d is 1.
D = torch.tensor(
    [
        [0.3, -0.1, 9.0, 9.0, 0.2, -0.5],
        [0.4, 0.1, -0.2, 0.0, 0.0, 0.0],
        [1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
    ]
)
MASK = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
ADV = torch.tensor([1.0, 0.0, -1.0])


def _inputs():
    old = torch.full((3, 6), -2.0)
    logp = (old - D).clone().requires_grad_(True)
    return logp, old


@pytest.mark.parametrize(
    ("gate", "value"),
    [
        ("action", (0.3 / 4 + 0.5 / 3) / 2),
        ("response", (0.0 + 0.5 / 3) / 2),  # row 0 sums to -0.1: closed
        ("token", ((0.3 + 0.2) / 4 + 0.5 / 3) / 2),
    ],
)
def test_paper_normalization_by_hand(gate, value):
    logp, old = _inputs()
    loss, stats = llds_loss(logp, old, ADV, MASK, coef=0.2, gate=gate)
    assert loss.item() == pytest.approx(0.2 * value, abs=1e-7)
    assert stats["value"].item() == pytest.approx(value, abs=1e-7)


def test_authors_token_mean_by_hand():
    logp, old = _inputs()
    loss, _ = llds_loss(logp, old, ADV, MASK, coef=1.0, gate="action", aggregation="token-mean")
    assert loss.item() == pytest.approx((0.3 + 0.4 + 0.1) / 13, abs=1e-7)  # 13 model tokens in all


def test_gradient_closed_form():
    logp, old = _inputs()
    loss, _ = llds_loss(logp, old, ADV, MASK, coef=0.2, gate="action")
    loss.backward()
    expected = torch.zeros(3, 6)
    expected[0, 0] = -0.2 / (4 * 2)  # -coef / (|y_0| |Y_pre|)
    expected[1, 0] = expected[1, 1] = -0.2 / (3 * 2)
    assert torch.allclose(logp.grad, expected, atol=1e-8)


def test_answer_weight_scales_penalty_but_not_gate():
    logp, old = _inputs()
    answer = torch.zeros(3, 6, dtype=torch.bool)
    answer[1, 1:3] = True  # row 1's last two tokens are the answer
    answer[0, 0] = True
    loss, _ = llds_loss(logp, old, ADV, MASK, coef=1.0, answer_mask=answer, answer_weight=0.5)
    assert loss.item() == pytest.approx((0.15 / 4 + (0.4 + 0.05) / 3) / 2, abs=1e-7)
    # weight 0 on row 0's only positive token: the gate still opens on the unweighted sum
    loss0, s = llds_loss(logp, old, ADV, MASK, coef=1.0, answer_mask=answer, answer_weight=0.0)
    assert loss0.item() == pytest.approx((0.0 + 0.4 / 3) / 2, abs=1e-7)
    assert s["gate_frac"].item() == pytest.approx(2 / 3)


def test_stats_by_hand():
    logp, old = _inputs()
    _, s = llds_loss(logp, old, ADV, MASK, gate="action")
    assert s["preserve_frac"].item() == pytest.approx(2 / 3)
    assert s["gate_frac"].item() == pytest.approx(2 / 3)  # 2 of 3 preserving actions fired
    assert s["penalized_token_frac"].item() == pytest.approx(3 / 7)
    assert s["mean_penalty"].item() == pytest.approx(0.8 / 3)


def test_old_log_probs_get_no_gradient_and_token_advantages_match():
    logp, old = _inputs()
    old.requires_grad_(True)
    loss, _ = llds_loss(logp, old, ADV, MASK)
    loss.backward()
    assert old.grad is None
    loss_tok, _ = llds_loss(logp, old, ADV.unsqueeze(1).expand(3, 6), MASK)
    assert loss_tok.item() == pytest.approx(loss.item())


def test_bad_arguments():
    logp, old = _inputs()
    with pytest.raises(ValueError, match="gate"):
        llds_loss(logp, old, ADV, MASK, gate="sequence")
    with pytest.raises(ValueError, match="aggregation"):
        llds_loss(logp, old, ADV, MASK, aggregation="seq-mean-token-sum")


def test_answer_weight_schedule():
    assert answer_weight_schedule(1.0) == 0.5
    assert answer_weight_schedule(3.0) == 1.0
    assert answer_weight_schedule(0.0) == 0.0
    assert answer_weight_schedule(1.0, baseline=4.0) == 0.25
    with pytest.raises(ValueError):
        answer_weight_schedule(1.0, baseline=0.0)


# ---------------------------------------------------------------- independent reference
def reference_llds(logp, old, adv, mask, gate, agg, answer=None, beta=1.0):
    """Plain loops over rows, actions and tokens, straight from the paper's definition."""
    B, T = len(mask), len(mask[0])
    total, n_pre, n_tok_all = 0.0, 0, 0
    for i in range(B):
        toks = [k for k in range(T) if mask[i][k]]
        n_tok_all += len(toks)
        if not toks or adv[i] < 0:
            continue
        n_pre += 1
        d = {k: old[i][k] - logp[i][k] for k in toks}
        if gate == "token":
            units = [[k] for k in toks]
            gates = [True] * len(units)
        elif gate == "response":
            units = [toks]
            gates = [sum(d.values()) > 0]
        else:
            units, cur = [], []
            for k in range(T):
                if mask[i][k]:
                    cur.append(k)
                elif cur:
                    units.append(cur)
                    cur = []
            if cur:
                units.append(cur)
            gates = [sum(d[k] for k in u) > 0 for u in units]
        row = 0.0
        for u, g in zip(units, gates, strict=True):
            if g:
                for k in u:
                    w = beta if (answer is not None and answer[i][k]) else 1.0
                    row += w * max(0.0, d[k])
        total += row / len(toks) if agg == "seq-mean-token-mean" else row
    if agg == "seq-mean-token-mean":
        return total / max(n_pre, 1)
    return total / max(n_tok_all, 1)


@st.composite
def llds_batches(draw):
    B = draw(st.integers(1, 5))
    T = draw(st.integers(1, 8))
    fl = st.floats(-3, 0, allow_nan=False, width=32)
    logp = [[draw(fl) for _ in range(T)] for _ in range(B)]
    old = [[draw(fl) for _ in range(T)] for _ in range(B)]
    mask = [[draw(st.booleans()) for _ in range(T)] for _ in range(B)]
    adv = [draw(st.sampled_from([-1.0, -0.3, 0.0, 0.5, 1.2])) for _ in range(B)]
    answer = [[draw(st.booleans()) for _ in range(T)] for _ in range(B)]
    return logp, old, adv, mask, answer


def _t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype)


@settings(max_examples=150, deadline=None)
@given(
    llds_batches(),
    st.sampled_from(["token", "response", "action"]),
    st.sampled_from(["seq-mean-token-mean", "token-mean"]),
    st.sampled_from([1.0, 0.5, 0.0]),
)
def test_matches_reference(batch, gate, agg, beta):
    logp, old, adv, mask, answer = batch
    loss, _ = llds_loss(
        _t(logp),
        _t(old),
        _t(adv),
        _t(mask, torch.bool),
        coef=1.0,
        gate=gate,
        aggregation=agg,
        answer_mask=_t(answer, torch.bool),
        answer_weight=beta,
    )
    ref = reference_llds(logp, old, adv, mask, gate, agg, answer, beta)
    assert loss.item() == pytest.approx(ref, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(llds_batches(), st.sampled_from(["seq-mean-token-mean", "token-mean"]))
def test_properties(batch, agg):
    logp, old, adv, mask, _ = batch
    lp, ol, a, m = _t(logp), _t(old), _t(adv), _t(mask, torch.bool)
    losses = {
        g: llds_loss(lp, ol, a, m, gate=g, aggregation=agg)[0].item()
        for g in ("token", "response", "action")
    }
    assert min(losses.values()) >= 0.0
    assert losses["token"] >= losses["response"] - 1e-12
    assert losses["token"] >= losses["action"] - 1e-12
    # no displacement -> no penalty
    assert llds_loss(lp, lp.clone(), a, m, aggregation=agg)[0].item() == 0.0
    # all advantages negative -> no penalty
    assert llds_loss(lp, ol, -a.abs() - 0.1, m, aggregation=agg)[0].item() == 0.0
    # out-of-mask values never matter, not even inf / nan
    junk_lp, junk_old = lp.clone(), ol.clone()
    junk_lp[~m] = float("-inf")
    junk_old[~m] = float("nan")
    junk = llds_loss(junk_lp, junk_old, a, m, aggregation=agg)[0].item()
    assert math.isclose(junk, losses["action"], abs_tol=1e-12)


@settings(max_examples=80, deadline=None)
@given(llds_batches(), st.data())
def test_action_gate_equals_response_gate_for_single_action_rows(batch, data):
    logp, old, adv, _, _ = batch
    B, T = len(logp), len(logp[0])
    mask = []
    for _ in range(B):
        start = data.draw(st.integers(0, T))
        end = data.draw(st.integers(start, T))
        mask.append([start <= k < end for k in range(T)])
    args = (_t(logp), _t(old), _t(adv), _t(mask, torch.bool))
    a = llds_loss(*args, gate="action")[0].item()
    r = llds_loss(*args, gate="response")[0].item()
    assert a == pytest.approx(r, abs=1e-12)


def test_answer_weight_for_by_hand():
    """LLDS-MA's beta, the one function the native trainer and the TRL adapter call."""
    from llds.algo import LLDSConfig

    assert LLDSConfig().answer_weight_for(0.5) == 1.0  # no mask_answer: unweighted
    ma = LLDSConfig(mask_answer=True)
    assert ma.answer_weight_for(0.5) == 0.25  # min(0.5 / 2, 1)
    assert ma.answer_weight_for(3.0) == 1.0  # clipped at 1
    assert ma.answer_weight_for(None) == 1.0  # searches unknown: unweighted
    assert LLDSConfig(mask_answer=True, answer_baseline=4.0).answer_weight_for(2.0) == 0.5
    assert LLDSConfig(mask_answer=True, answer_weight=0.7).answer_weight_for(0.1) == 0.7
