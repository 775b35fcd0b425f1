"""The SFT loop's progress: a bar on a terminal, a bounded number of `llds.sft` log lines
elsewhere, nothing when turned off."""

from __future__ import annotations

import io
import logging

from rich.console import Console

from llds.sft.progress import LINES, SFTProgress


def _steps(total: int, console: Console, enabled: bool, caplog) -> list[str]:
    caplog.clear()
    level = caplog.at_level(logging.INFO, logger="llds.sft")
    with level, SFTProgress(total, enabled=enabled, console=console) as bar:
        for step in range(1, total + 1):
            bar.step_done(step, 1.0 / step, 1e-3)
    return [r.getMessage() for r in caplog.records if r.name == "llds.sft"]


def test_off_a_terminal_a_line_every_twentieth_and_at_the_last_step(caplog):
    assert LINES == 20
    plain = io.StringIO()
    lines = _steps(50, Console(file=plain, force_terminal=False), True, caplog)
    # every ceil(50 / 20) = 3 steps: 3, 6, ..., 48, then the last step, 50
    assert [int(m.split()[2].split("/")[0]) for m in lines] == [*range(3, 49, 3), 50]
    assert lines[-1].startswith("SFT step 50/50 | loss 0.0200 | lr 1.00e-03 | ")
    assert plain.getvalue() == ""  # no bar drawn into a file
    assert len(_steps(7, Console(file=io.StringIO(), force_terminal=False), True, caplog)) == 7


def test_on_a_terminal_the_bar_and_no_lines(caplog):
    screen = io.StringIO()
    lines = _steps(8, Console(file=screen, force_terminal=True, width=100), True, caplog)
    assert lines == []
    assert "SFT" in screen.getvalue() and "loss 0.1250" in screen.getvalue()


def test_turned_off_nothing(caplog):
    for terminal in (False, True):
        screen = io.StringIO()
        assert _steps(8, Console(file=screen, force_terminal=terminal), False, caplog) == []
        assert screen.getvalue() == ""
