"""The shares of held-out responses that EM does not show (`llds.analysis.eval_shares`): answers
copied from a retrieved passage, and degenerate punctuation runs, counted by hand."""

from __future__ import annotations

import pytest

from llds.analysis.eval_shares import copied_share, punctuation_run_share
from llds.monitor.degenerate import punctuation_run_frac
from llds.runs.eval_result import EvalRecord, EvalResult


def _record(prediction: str | None, response: str) -> EvalRecord:
    return EvalRecord(
        id="q",
        source="world",
        question="?",
        golds=["Pudrom"],
        prediction=prediction,
        em=0.0,
        f1=0.0,
        sub_em=0.0,
        valid_searches=1,
        answered=prediction is not None,
        response=response,
    )


def test_copied_share_counts_answers_found_in_retrieved_passages() -> None:
    passage = (
        "<search> x </search>\n"
        "<information>Doc 1 The currency of Dirdromro is Pudrom.</information>\n"
    )
    records = [
        _record("Pudrom", passage + "<answer> Pudrom </answer>"),  # copied
        _record("Dirdromro", passage + "<answer> Dirdromro </answer>"),  # copied, wrong
        _record("Varglar", passage + "<answer> Varglar </answer>"),  # not in any passage
        _record("Varglar", "<search> Varglar </search><answer> Varglar </answer>"),  # query only
        _record("pudrom).", passage + "<answer> pudrom). </answer>"),  # copied, as EM normalizes
        _record("Dirdrom", passage + "<answer> Dirdrom </answer>"),  # a prefix of a word only
        _record(None, passage),  # unanswered: not counted
    ]
    assert copied_share(EvalResult.of(records)) == pytest.approx(3 / 6)
    assert copied_share(EvalResult.of([_record(None, passage)])) is None


def test_punctuation_run_share_counts_degenerate_responses() -> None:
    passage = "<search> river of Shuballor </search>\n<information>Doc 1 ...</information>\n"
    records = [
        _record("Kulban", passage + "<answer> Kulban </answer>"),  # clean
        _record("Kulban)))))", passage + "<answer> Kulban))))) </answer>"),  # 5 in a row
        _record("Kulban))))", passage + "<answer> Kulban)))) </answer>"),  # 4: not counted
        _record(None, "<search> river of Shuballor)))))))))) </search>"),  # in a query, unanswered
        _record("Kulban", passage + "<answer> Kulban </answer>...!!..."),  # mixed, no run of 5
        _record("x", "</search></search></search></search></search>"),  # tags are not a run
    ]
    assert punctuation_run_share(EvalResult.of(records)) == pytest.approx(2 / 6)
    assert punctuation_run_share(EvalResult.of([])) is None


def test_the_trainer_and_the_study_count_punctuation_runs_alike() -> None:
    texts = ["<answer> Kulban))))) </answer>", "<answer> Kulban </answer>", "....!", "-----"]
    assert punctuation_run_frac(texts) == pytest.approx(2 / 4)
    assert punctuation_run_frac([]) == 0.0
    result = EvalResult.of([_record("x", t) for t in texts])
    assert punctuation_run_share(result) == punctuation_run_frac(texts)
