"""The alarm registry reproduces every alarm the committed runs raised while they trained.

Every committed run log (`experiments/**/metrics.jsonl.gz`) is replayed with the detectors
that existed when the studies ran (the ten built-ins before the drift detectors); where the run
committed its `alarms.jsonl`, the replay must equal it line for line (step, kind, severity,
message, evidence), and in every log the per-step `alarms/count` the trainer wrote must equal
the number of alarms the replay raises at that step. Runs recorded before `search_decline`
existed match with that one detector left out, and then hold no `search_decline` alarm. A run
that saved its own monitor settings (its `config.json` has a `monitor` section, as the collapse
corpus's runs do) is replayed with those, as `llds monitor replay` replays it. Every committed
run trained before the library's defaults became the settings frozen on the collapse corpus
(`experiments/monitor_tuning/frozen.yaml`), so what a run left unset is replayed at the
defaults it trained with (`TRAINED_WITH`).
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from llds.monitor.alarms import ALARM_KINDS, MonitorConfig, scan_alarms
from llds.monitor.replay import monitor_config_from

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
LOGS = sorted(EXPERIMENTS.rglob("metrics.jsonl.gz"))
STUDY_DETECTORS = (
    "displacement_decay",
    "likelihood_decay",
    "collapse",
    "reward_collapse",
    "stagnation",
    "entropy_spike",
    "grad_norm_spike",
    "ratio_spike",
    "nonfinite",
    "search_decline",
)
"""The detectors the committed runs were trained with (`search_decline` the latest of them)."""
LATEST = "search_decline"
TRAINED_WITH: dict[str, dict[str, Any]] = {
    "displacement_decay": {"severity": "critical"},
    "collapse": {"severity": "critical"},
    "reward_collapse": {"severity": "critical"},
    "search_decline": {"severity": "warning"},
    "entropy_drift": {"severity": "warning", "high": 2.0},
    "lr_divergence": {"severity": "warning", "grad_growth": 2.0},
}
"""The library's defaults before the freeze, where the frozen settings moved them: what the
committed runs trained with wherever their saved settings leave a key unset."""


def as_trained(section: dict[str, Any]) -> dict[str, Any]:
    """A saved `monitor` section with every key it leaves unset (absent or null) at the
    defaults the run trained with."""
    alarms = dict(section.get("alarms", {}))
    for name, then in TRAINED_WITH.items():
        saved = {k: v for k, v in alarms.get(name, {}).items() if v is not None}
        alarms[name] = {**then, **saved}
    return {**section, "alarms": alarms}


def study_config() -> MonitorConfig:
    alarms = {kind: {"enabled": kind in STUDY_DETECTORS} for kind in ALARM_KINDS}
    return monitor_config_from(as_trained({"alarms": alarms}), "the studies' detectors")


def settings_of(run_dir: Path) -> MonitorConfig:
    """The run's own saved monitor settings, else the detectors the studies ran with."""
    saved = run_dir / "config.json"
    if saved.is_file():
        section = json.loads(saved.read_text(encoding="utf-8")).get("monitor")
        if section is not None:
            return monitor_config_from(as_trained(section), str(saved))
    return study_config()


def rows_of(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_the_study_detectors_are_the_first_built_ins() -> None:
    assert ALARM_KINDS[: len(STUDY_DETECTORS)] == STUDY_DETECTORS


def test_there_are_committed_logs_to_replay() -> None:
    assert len(LOGS) >= 90
    assert len([p for p in LOGS if (p.parent / "alarms.jsonl").is_file()]) >= 70


@pytest.mark.parametrize("log", LOGS, ids=lambda p: str(p.parent.relative_to(EXPERIMENTS)))
def test_replay_reproduces_the_alarms_the_run_raised(log: Path) -> None:
    rows = rows_of(log)
    replayed = [a.to_dict() for a in scan_alarms(rows, settings_of(log.parent))]
    logged = Counter({r["step"]: r["alarms/count"] for r in rows if r.get("alarms/count")})
    committed_file = log.parent / "alarms.jsonl"
    committed = []
    if committed_file.is_file():
        lines = committed_file.read_text(encoding="utf-8").splitlines()
        committed = [json.loads(line) for line in lines if line.strip()]
        for c in committed:
            c.pop("action")  # what the trainer did, not what the monitor raised
    if Counter(a["step"] for a in replayed) != logged:  # a run from before the latest detector
        assert not any(c["kind"] == LATEST for c in committed)
        replayed = [a for a in replayed if a["kind"] != LATEST]
    assert Counter(a["step"] for a in replayed) == logged
    if committed_file.is_file():
        assert json.loads(json.dumps(replayed)) == committed
