"""The SmolLM2 one-step probes as measured: correct responses that lost likelihood, pooled over
the 30 questions, the questions with at least one, and the questions whose correct responses
lost likelihood on average (the probe's own `lld_share`, Eq. 3 averaged per question).

    python experiments/smollm2/probe_summary.py
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from llds.analysis.pooled import probe_fell

PROBES = Path(__file__).resolve().parent / "results" / "probe"


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    print("| probe | correct responses that fell | questions with one or more | mean below 0 |")
    print("| --- | --- | --- | --- |")
    for path in sorted(PROBES.glob("*/probe.json")):
        p = probe_fell(json.loads(path.read_text())["results"])
        share = f"{p.fell} of {p.correct} ({100 * p.share:.1f}%)" if p.share is not None else "-"
        with_one = f"{p.questions_with_fall} of {p.questions}"
        mean = f"{p.questions_mean_below_zero} of {p.questions}"
        print(f"| {path.parent.name} | {share} | {with_one} | {mean} |")


if __name__ == "__main__":
    main()
