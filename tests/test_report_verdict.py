"""The report's verdict: collapsed or not by the pre-registered definition, censored when fewer
than 30 steps were logged after the collapse, the cause named only where a signature departs
from the run's own first steps (else "no known signature"), the first critical alarm at least
20 steps ahead, the stabilizer docs/stabilizers.md names for each cause, "did not learn" only
when neither the reward nor held-out EM rose; in the HTML and on the terminal."""

from __future__ import annotations

from pathlib import Path

from llds.cli import main
from llds.io import write_jsonl
from llds.monitor.alarms import Alarm
from llds.monitor.phases import detect_phases
from llds.report import html as report_mod
from llds.report.attribution import COLLAPSE, MECHANISMS, STABILIZERS, run_events, verdict_of
from llds.report.collapse import censored
from llds.report.run_info import EvalPoint, HeldOut
from llds.report.text import verdict
from synthetic_logs import synthetic_rows


def _summary(rows, held_out=None):
    run = report_mod.RunData("r", Path("r"), rows, detect_phases(rows), [], None, None, held_out)
    return report_mod.summarize(run)


def _verdict(rows, alarms=()):
    return verdict(_summary(rows), run_events(rows, list(alarms)), verdict_of(rows, alarms))


def falling(steps: int, share_after: float = 0.2, fall: int = 61) -> list[dict]:
    """Reward 0.6 to step `fall - 1`, then 0.1: the 10-step median holds five 0.1s at step
    `fall + 4` (median 0.35, above half the peak) and six at `fall + 5` (0.1): the
    pre-registered collapse at step 66. The LLD share 0.2 to step 40, `share_after` from step
    41; entropy flat."""
    return [
        {
            "step": s,
            "reward/mean": 0.6 if s < fall else 0.1,
            "lld/share_pos_fell": 0.2 if s <= 40 else share_after,
            "policy/entropy": 0.8,
        }
        for s in range(1, steps + 1)
    ]


def test_every_mechanism_has_a_stabilizer_named_in_the_docs():
    page = (Path(__file__).resolve().parents[1] / "docs" / "stabilizers.md").read_text()
    assert set(STABILIZERS) == set(MECHANISMS)
    for _, switch in STABILIZERS.values():
        assert f"`{switch.split('=')[0]}" in page, switch


def test_a_collapsed_run_names_its_cause_and_stabilizers():
    rows = synthetic_rows("collapse", seed=1, steps=170)
    events = run_events(rows, [])
    collapse = next(e for e in events if e.kind == COLLAPSE)
    text = _verdict(rows)
    assert f"collapsed at step {collapse.step}" in text and "cause named" in text
    present = {f.mechanism for f in collapse.with_status("present")}
    # the synthetic collapse's gradients grow tenfold and its entropy blows up; with no
    # learning rate in the log the grown gradients are a symptom like the entropy: both named
    assert present == {"learning-rate divergence", "entropy"}
    v = verdict_of(rows, [])
    assert (v.named, v.downstream) == (("entropy", "learning-rate divergence"), ())
    for mechanism in v.named:
        name, switch = STABILIZERS[mechanism]
        assert f"{mechanism}: {name}" in text and switch in text
    assert "against the run's own first 20 steps" in text
    # the same run with its learning rate logged and tripled after step 100: the set-up fault
    # is named, the entropy listed as downstream of it, with no stabilizer of its own
    rising = [{**r, "lr": 3e-4 if r["step"] > 100 else 1e-4} for r in rows]
    v = verdict_of(rising, [])
    assert (v.named, v.downstream) == (("learning-rate divergence",), ("entropy",))
    text = _verdict(rising)
    assert "downstream of it (not named): entropy" in text
    assert f"entropy: {STABILIZERS['entropy'][0]}" not in text
    assert "also present, downstream: entropy" in v.line("run")


def test_a_collapse_without_a_departure_has_no_known_signature():
    # the collapse at 66; its window 47-66: the share there 0.2, as in steps 1-20
    flat = falling(120)
    v = verdict_of(flat, [])
    assert v.collapse_step == 66 and v.collapsed and v.named == ()
    assert "no known signature" in _verdict(flat)
    lld = falling(120, share_after=0.8)
    v = verdict_of(lld, [])
    assert v.named == ("LLD",) and v.codes == ("lld",)
    assert v.line("run") == (
        "run: collapsed at step 66; cause named: LLD; no critical alarm 20 or more steps ahead"
    )


def test_a_collapse_near_the_end_of_the_log_is_censored():
    # the collapse at 66: steps 67-95 are 29 logged steps after it (censored), 67-96 are 30
    short, enough = falling(95), falling(96)
    assert censored([r["step"] for r in short], 66) and not censored(
        [r["step"] for r in enough], 66
    )
    v = verdict_of(short, [])
    assert v.collapse_step == 66 and v.censored and not v.collapsed
    assert "nothing after step 95 was seen" in v.line("run")
    assert "censored" in _verdict(short) and "nothing after step 95 was seen" in _verdict(short)
    assert _summary(short)["censored"] and not _summary(short)["collapsed"]
    assert verdict_of(enough, []).collapsed


def test_the_first_timely_alarm_is_a_critical_one_at_least_20_steps_ahead():
    rows = falling(120, share_after=0.8)  # collapse at 66

    def critical(step: int) -> Alarm:
        return Alarm(step, "displacement_decay", "critical", "x")

    late = verdict_of(rows, [critical(47)])  # 19 steps ahead
    assert late.first_critical.step == 47 and late.first_timely is None
    timely = verdict_of(
        rows, [Alarm(30, "ratio_spike", "warning", "w"), critical(46), critical(50)]
    )
    assert timely.first_timely.step == 46
    assert "first timely alarm: displacement_decay at step 46 (20 steps ahead)" in timely.line("r")
    assert "First timely alarm: <code>displacement_decay</code> at step 46, 20 steps ahead." in (
        _verdict(rows, [critical(46)])
    )


def test_did_not_learn_only_when_neither_reward_nor_heldout_em_rose():
    flat = [{"step": i + 1, "reward/mean": 0.05} for i in range(40)]
    assert "did not learn" in _verdict(flat)
    start = EvalPoint(0, 0.267, 60, Path("warm.json"))
    rose = HeldOut((EvalPoint(40, 0.558, 60, Path("e.json")),), start)
    s = _summary(flat, rose)
    assert s["learned"] and s["heldout_em_rose"] and not s["reward_rose"]
    text = verdict(s, run_events(flat, []), verdict_of(flat, []))
    assert "did not collapse" in text and "did not learn" not in text
    fell = HeldOut((EvalPoint(40, 0.2, 60, Path("e.json")),), start)
    assert "did not learn" in verdict(
        _summary(flat, fell), run_events(flat, []), verdict_of(flat, [])
    )


def test_llds_report_prints_each_verdict_on_the_terminal(tmp_path, capsys):
    for name, rows in (("lld", falling(120, share_after=0.8)), ("short", falling(95))):
        write_jsonl(tmp_path / name / "metrics.jsonl", rows)
    rc = main(
        ["report", str(tmp_path / "lld"), str(tmp_path / "short"), "--out", str(tmp_path / "r")]
    )
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("lld: collapsed at step 66; cause named: LLD; ")
    assert lines[1].startswith(
        "short: reward fell at step 66 but the log ends at step 95: censored"
    )
    assert lines[2].startswith("report written to ")
