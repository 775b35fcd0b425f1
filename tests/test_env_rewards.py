"""QA metrics, answer extraction, format check and the reward."""

from __future__ import annotations

import math
import string
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llds.env import (
    FormatRewardConfig,
    compute_reward,
    exact_match,
    extract_answer,
    f1_score,
    final_answer,
    information_block,
    invalid_action_message,
    is_valid_sequence,
    normalize_answer,
    score_answer,
    substring_match,
)
from llds.errors import ConfigError, UserInputError
from llds.retrieval.base import Hit

# --- normalize_answer -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  an   apple, a day!  ", "apple day"),
        ("U.S.A.", "usa"),
        ("theatre", "theatre"),  # articles only as whole words
        ("Anne and Theo", "anne and theo"),
        ("“Zürich”", "zürich"),  # unicode quotes are punctuation, accents stay
        ("ＰＡＲＩＳ", "paris"),  # full-width letters
        ("Straße", "strasse"),  # casefold
        ("naïve — café", "naïve café"),  # em dash dropped
        ("a\tthe\nan", ""),
        ("", ""),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_normalize_matches_squad_on_ascii():
    # independent restatement of the SQuAD v1.1 normalizer for ASCII text
    def squad(s):
        s = s.lower()
        s = "".join(ch for ch in s if ch not in set(string.punctuation))
        s = " ".join(w for w in s.split() if w not in ("a", "an", "the"))
        return " ".join(s.split())

    for s in ["The cat's hat.", "A-ha! An (old) THE band", "e=mc^2 ~ the $5 deal", "x_y the_z"]:
        assert normalize_answer(s) == squad(s)


@given(st.text(max_size=30))
def test_normalize_answer_idempotent(s):
    once = normalize_answer(s)
    assert normalize_answer(once) == once


# --- extract_answer -------------------------------------------------------------------------


def test_extract_last_answer():
    text = "<answer> Rome </answer> hmm <answer> Paris </answer>"
    assert extract_answer(text) == "Paris"


def test_extract_answer_in_middle_vs_last():
    assert extract_answer("<think>x</think><answer> Paris </answer> then more text") == "Paris"


def test_extract_answer_none_and_empty():
    assert extract_answer("<think>no answer</think>") is None
    assert extract_answer("<answer> unclosed") is None
    assert extract_answer("</answer> orphan") is None
    assert extract_answer("<answer>   </answer>") == ""


def test_extract_answer_nested_uses_nearest_opening():
    assert extract_answer("<answer> a <answer> b </answer>") == "b"
    # a later orphan closing tag falls back to the previous complete span
    assert extract_answer("<answer> a </answer> junk </answer>") == "a"


def test_extract_answer_skips_environment_text():
    hits = [Hit("1", '"Doc"\nthe text says <answer> Berlin </answer>')]
    text = "<think>t</think><search>q</search>" + information_block(hits)
    assert extract_answer(text) is None
    assert extract_answer(text + "<think>t</think><answer>Bonn</answer>") == "Bonn"
    # the corrective messages mention the answer tags but are not answers
    assert extract_answer("blah" + invalid_action_message()) is None


def test_extract_answer_unicode():
    assert extract_answer("<answer> 北京 </answer>") == "北京"


# --- metrics --------------------------------------------------------------------------------


def test_exact_match_aliases():
    golds = ["New York City", "NYC", "the big apple"]
    assert exact_match("new york city.", golds) == 1.0
    assert exact_match("Big Apple", golds) == 1.0
    assert exact_match("New York", golds) == 0.0
    assert exact_match(None, golds) == 0.0
    assert exact_match("", ["the"]) == 0.0  # empty never matches
    assert exact_match("Paris", "Paris") == 1.0  # a single gold string, not its characters
    assert exact_match("P", "Paris") == 0.0


def test_no_golds_is_an_error():
    with pytest.raises(UserInputError):
        exact_match("x", [])


@given(st.text(max_size=10), st.lists(st.text(max_size=10), min_size=1, max_size=4), st.randoms())
def test_exact_match_symmetric_under_alias_order(pred, golds, rnd):
    shuffled = list(golds)
    rnd.shuffle(shuffled)
    assert exact_match(pred, golds) == exact_match(pred, shuffled)
    assert f1_score(pred, golds) == f1_score(pred, shuffled)


def test_f1_hand_computed():
    # pred tokens: barack obama jr ; gold tokens: barack obama -> P=2/3 R=1 F1=0.8
    assert f1_score("Barack Obama Jr.", ["Barack Obama"]) == pytest.approx(0.8)
    # pred: new york ; gold: new york city -> P=1 R=2/3 F1=0.8; second gold gives 0
    assert f1_score("New York", ["Boston", "New York City"]) == pytest.approx(0.8)
    # multiplicity: pred "a b b" -> "b b" (article dropped); gold "b c" -> overlap 1, P=1/2, R=1/2
    assert f1_score("a b b", ["b c"]) == pytest.approx(0.5)
    assert f1_score("paris", ["Paris"]) == 1.0
    assert f1_score("london", ["Paris"]) == 0.0
    assert f1_score(None, ["Paris"]) == 0.0
    assert f1_score("", ["Paris"]) == 0.0


def test_f1_yes_no_special_case():
    assert f1_score("no", ["yes"]) == 0.0
    assert f1_score("yes it is", ["yes"]) == 0.0  # would be 0.5 without the special case
    assert f1_score("Yes.", ["yes"]) == 1.0
    assert f1_score("yes", ["no", "yes"]) == 1.0


def _f1_reference(pred, gold):
    p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
    same = sum((Counter(p) & Counter(g)).values())
    if same == 0:
        return 0.0
    return 2 * same / (len(p) + len(g))  # equivalent closed form of 2PR/(P+R)


@given(
    st.lists(st.sampled_from(["x", "y", "z", "w"]), max_size=6).map(" ".join),
    st.lists(st.sampled_from(["x", "y", "z", "v"]), min_size=1, max_size=6).map(" ".join),
)
def test_f1_matches_closed_form(pred, gold):
    assert f1_score(pred, [gold]) == pytest.approx(_f1_reference(pred, gold))


def test_substring_match():
    assert substring_match("It is the city of Paris, France", ["Paris"]) == 1.0
    assert substring_match("Lyon", ["Paris", "Lyon"]) == 1.0
    assert substring_match("Paris", ["Paris, France"]) == 0.0
    assert substring_match("anything", ["the"]) == 0.0  # empty gold is skipped
    assert substring_match(None, ["x"]) == 0.0


# --- format check ---------------------------------------------------------------------------

INFO = "\n\n<information>Doc 1(Title: P) <think> inside docs is fine</information>\n\n"
TURN = "<search>q</search>" + INFO + "<think>b</think>"


@pytest.mark.parametrize(
    "text",
    [
        "<think>a</think><answer>b</answer>",
        " <think>a</think>\n\n<answer>b</answer>\n",
        "<think>a</think><search>q</search>" + INFO + "<think>b</think><answer>c</answer>",
        "<think>a</think>" + TURN * 2 + "<answer>c</answer>",
        "<think></think><answer></answer>",
    ],
)
def test_valid_sequences(text):
    assert is_valid_sequence(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "<answer>b</answer>",  # no think first
        "<think>a</think>",  # no answer
        "<think>a</think> prose <answer>b</answer>",  # text between elements
        "<think>a</think><answer>b</answer> extra",  # text after the answer
        "<think>a</think><search>q</search><think>b</think><answer>c</answer>",  # no information
        "<think>a</think><search>q</search>" + INFO + "<answer>c</answer>",  # no think after info
        "<think>a</think><search> </search>" + INFO + "<think>b</think><answer>c</answer>",
        "<think>a<search>q</search></think><answer>c</answer>",  # nested
        "<think>a</think><answer>b</answer><answer>c</answer>",  # two answers
        "<think>a</think><think>b</think><answer>c</answer>",  # two thinks in a row
        "<think>a</think></think><answer>b</answer>",  # orphan closing tag
        "<think>a<answer>b</answer>",  # unclosed think
        "<think>a</think>" + invalid_action_message() + "<think>b</think><answer>c</answer>",
    ],
)
def test_invalid_sequences(text):
    assert not is_valid_sequence(text)


# --- compute_reward -------------------------------------------------------------------------

VALID_RIGHT = "<think>t</think><answer> Paris </answer>"
INVALID_RIGHT = "<answer> Paris </answer>"
VALID_WRONG = "<think>t</think><answer> Lyon </answer>"
INVALID_WRONG = "blah <answer> Lyon </answer>"
NO_ANSWER = "<think>t</think><search>q</search>"


def test_default_reward_is_pure_em():
    assert compute_reward(VALID_RIGHT, ["paris"]).reward == 1.0
    assert compute_reward(INVALID_RIGHT, ["paris"]).reward == 1.0
    assert compute_reward(VALID_WRONG, ["paris"]).reward == 0.0
    assert compute_reward(NO_ANSWER, ["paris"]).reward == 0.0


def test_reward_result_fields():
    r = compute_reward("<think>t</think><answer>Paris France</answer>", ["Paris"])
    assert (r.reward, r.em, r.f1, r.sub_em) == (0.0, 0.0, pytest.approx(2 / 3), 1.0)
    assert r.answer == "Paris France" and r.valid_format
    assert compute_reward("<think>t</think><answer>Paris France</answer>", ["Paris"],
                          metric="f1").reward == pytest.approx(2 / 3)  # fmt: skip
    assert compute_reward(NO_ANSWER, ["x"]).answer is None


def test_format_reward_table():
    cfg = FormatRewardConfig(structure_score=0.2, final_format_score=0.1, retrieval_score=0.1,
                             enabled=True)  # fmt: skip
    golds = ["Paris"]
    assert compute_reward(VALID_RIGHT, golds, format_config=cfg).reward == 1.0
    assert compute_reward(INVALID_RIGHT, golds, format_config=cfg).reward == pytest.approx(0.8)
    assert compute_reward(VALID_WRONG, golds, format_config=cfg).reward == pytest.approx(0.2)
    assert compute_reward(INVALID_WRONG, golds, format_config=cfg).reward == pytest.approx(0.1)
    assert compute_reward(NO_ANSWER, golds, format_config=cfg).reward == 0.0
    # disabled config = pure EM
    off = FormatRewardConfig()
    assert compute_reward(INVALID_WRONG, golds, format_config=off).reward == 0.0


def test_format_reward_retrieval_bonus():
    cfg = FormatRewardConfig(structure_score=0.3, retrieval_score=0.05, enabled=True)
    golds = ["Paris"]
    hit_with_gold = information_block([Hit("1", '"France"\nThe capital is Paris.')])
    hit_without = information_block([Hit("1", '"France"\nA country.')])
    rollout = "<think>t</think><search>capital</search>{info}<think>u</think><answer>Lyon</answer>"
    r = compute_reward(rollout.format(info=hit_with_gold), golds, format_config=cfg)
    assert r.valid_format and r.reward == pytest.approx(0.35)
    r = compute_reward(rollout.format(info=hit_without), golds, format_config=cfg)
    assert r.reward == pytest.approx(0.3)
    # explicit retrieved texts override the information blocks
    r = compute_reward(rollout.format(info=hit_without), golds, format_config=cfg,
                       retrieved_texts=["PARIS!"])  # fmt: skip
    assert r.reward == pytest.approx(0.35)
    # no bonus when the format is invalid
    r = compute_reward("x" + rollout.format(info=hit_with_gold), golds, format_config=cfg)
    assert r.reward == pytest.approx(0.1)


def test_reward_config_errors():
    with pytest.raises(ConfigError, match="metric"):
        compute_reward(VALID_RIGHT, ["Paris"], metric="bleu")
    with pytest.raises(ConfigError, match="binary"):
        compute_reward(VALID_RIGHT, ["Paris"], metric="f1",
                       format_config=FormatRewardConfig(enabled=True))  # fmt: skip
    for bad in (-0.1, 1.5, math.nan, "0.2"):
        with pytest.raises(ConfigError, match="structure_score"):
            FormatRewardConfig(structure_score=bad)


def test_prompt_example_answer_is_never_scored():
    # scoring sees only the response; a rollout that never answers gets 0 even if gold is "Paris"
    assert compute_reward("<think>I do not know</think>", ["Paris"]).reward == 0.0


# --- final answer action only ---------------------------------------------------------------

STITCHED = "<answer> Paris" + invalid_action_message() + " </answer>"


def test_final_answer_reads_the_last_turn_only():
    assert final_answer(["<search> q </search>", "<think>t</think><answer> Paris </answer>"]) == (
        "Paris"
    )
    # opened in one turn, closed in the next: no turn holds a complete span
    assert final_answer(["<answer> Paris", " </answer>"]) is None
    # an earlier turn's answer does not count when the last turn is no answer
    assert final_answer(["<answer> Rome </answer>", "<think> more"]) is None
    # the deciding span of the last turn (first closing tag), as the environment acted on it
    assert final_answer(["<answer> Rome </answer><answer> Paris </answer>"]) == "Rome"
    assert final_answer(["<answer> a <search> q </search> b </answer>"]) is None  # a search
    assert final_answer(["<answer>  </answer>"]) == ""
    assert final_answer([]) is None


def test_score_answer_scores_only_the_given_answer():
    # the stitched text still has a last complete span for the plain-text path...
    assert extract_answer(STITCHED) == "Paris"
    assert compute_reward(STITCHED, ["Paris"]).reward == 1.0
    # ...but a rollout without a final answer action scores 0, whatever its text holds
    r = score_answer(None, ["Paris"], response_text=STITCHED)
    assert (r.reward, r.em, r.f1, r.sub_em, r.answer, r.valid_format) == (
        0.0, 0.0, 0.0, 0.0, None, False,
    )  # fmt: skip
    r = score_answer("Paris France", ["Paris"], response_text=VALID_WRONG)
    assert (r.reward, r.em, r.f1, r.sub_em) == (0.0, 0.0, pytest.approx(2 / 3), 1.0)
    assert r.answer == "Paris France" and r.valid_format  # the format check reads the text
    assert score_answer("Paris France", ["Paris"], metric="f1").reward == pytest.approx(2 / 3)


def test_score_answer_format_reward_table():
    cfg = FormatRewardConfig(structure_score=0.2, final_format_score=0.1, retrieval_score=0.1,
                             enabled=True)  # fmt: skip
    golds = ["Paris"]

    def reward(answer, text, **kw):
        return score_answer(answer, golds, response_text=text, format_config=cfg, **kw).reward

    assert reward("Paris", VALID_RIGHT) == 1.0
    assert reward("Paris", INVALID_RIGHT) == pytest.approx(0.8)
    assert reward("Lyon", VALID_WRONG) == pytest.approx(0.2)
    assert reward("Lyon", INVALID_WRONG) == pytest.approx(0.1)
    # no final answer action: 0, where the plain-text path finds a stitched answer (0.8)
    assert compute_reward(STITCHED, golds, format_config=cfg).reward == pytest.approx(0.8)
    assert reward(None, STITCHED) == 0.0
    # valid sequence, wrong answer, gold in the retrieved text: structure + retrieval bonus
    info = information_block([Hit("1", '"France"\nThe capital is Paris.')])
    text = f"<think>t</think><search>capital</search>{info}<think>u</think><answer>Lyon</answer>"
    assert reward("Lyon", text) == pytest.approx(0.3)
    assert reward("Lyon", text, retrieved_texts=["nothing"]) == pytest.approx(0.2)


@pytest.mark.parametrize(
    "text", [VALID_RIGHT, INVALID_RIGHT, VALID_WRONG, INVALID_WRONG, NO_ANSWER, STITCHED]
)
def test_compute_reward_is_score_answer_of_the_extracted_answer(text):
    cfg = FormatRewardConfig(enabled=True)
    for fmt in (None, cfg):
        assert compute_reward(text, ["Paris"], format_config=fmt) == score_answer(
            extract_answer(text), ["Paris"], response_text=text, format_config=fmt
        )
