"""A refused command line costs little before its line: the CLI, and every command's config
(read and checked before any work), import neither torch nor transformers, and a fresh `llds`
process that refuses its input spends well under the 3 s a bad input may cost (its CPU time,
which other jobs on the machine barely change). Figures: benchmarks/cli_startup.py."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers")
CPU_BOUND_S = 2.5
"""the acceptance's 3 s with margin; torch alone costs about 2 s of CPU on the 2-core machine"""

IMPORTS = """
import json, sys
from llds.cli import main
codes = [main([name, "nosuch=1"]) for name in ("train", "eval", "probe", "sft", "index")]
print(json.dumps({"codes": codes, "heavy": [m for m in %r if m in sys.modules]}))
"""


def test_no_command_config_imports_torch() -> None:
    """Each command's config is parsed and its unknown key refused without torch."""
    proc = subprocess.run(
        [sys.executable, "-c", IMPORTS % (HEAVY,)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["codes"] == [2, 2, 2, 2, 2]
    assert result["heavy"] == []
    assert proc.stderr.count("nosuch: unknown key") == 5


@pytest.mark.parametrize(
    ("args", "code"),
    [(["--version"], 0), (["train", "nosuch=1"], 2), (["eval", "model=m", "nosuch=1"], 2)],
)
def test_a_fresh_process_refuses_within_the_bound(args: list[str], code: int) -> None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        [sys.executable, "-m", "llds.cli", *args], capture_output=True, text=True, timeout=120
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == code, proc.stderr
    if code:  # one line, naming the key
        [line] = proc.stderr.strip().splitlines()
        assert line.startswith(f"llds {args[0]}: error: command line: nosuch: unknown key")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    assert cpu < CPU_BOUND_S, f"llds {' '.join(args)} took {cpu:.2f} s of CPU"
