"""The collapse corpus's definitions (PROTOCOL.md): arms, causes, seeds, splits, and how a run
of one is configured. Every script of this folder reads them from here.

A seed has one trunk (the recipe for `ONSET` steps) and one branch per arm: the trunk's log
and last checkpoint copied into the branch's folder and resumed with the arm's settings, the
changed keys allowed explicitly, as a user resumes with changed settings.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
WARM = HERE / "warm"
"""the committed world and warm start every organism run begins from"""
RUNS = HERE / "runs"
"""where each finished run's logs are committed (the manifest's `run` folders)"""
WORK = Path("runs/collapse_corpus")
"""where runs train (checkpoints stay here, out of the repository)"""

ONSET = 60
"""trunk length: every cause starts at step ONSET + 1"""
STEPS = 240
"""steps of every organism run"""
CENSOR_AFTER = 30
"""a collapse needs this many logged steps after it, else it is censored"""
ABRUPT_BEFORE = 30
"""a collapse this soon after its cause's onset is abrupt"""
LR_RAMP = 100
"""steps over which the `lr` cause climbs to its peak"""

EVAL_LIMIT = 60
"""held-out questions of every evaluation"""

RECIPE = [
    "algo.llds.enabled=false",
    f"steps={ONSET}",
    "eval_every=10",
    f"data.eval_limit={EVAL_LIMIT}",
    "save_every=50",
    "keep_checkpoints=2",
    "threads=1",
    "diagnostics.on_alarm=warn",
    "logging.tensorboard=false",
    "logging.progress=false",
]
"""the `organism` preset's overrides shared by every organism run (PROTOCOL.md)"""


@dataclass(frozen=True)
class Cause:
    """A mechanism's cause: its overrides at a strength, and the keys a branch may change."""

    mechanism: str
    allow: tuple[str, ...]
    grid: tuple[str, ...]
    """the pilot's strengths, the milder first (PROTOCOL.md)"""

    def overrides(self, strength: str, onset: int = ONSET) -> list[str]:
        """The settings of steps `onset + 1` on (the trunk ran steps 1..onset without them)."""
        if self.mechanism == "lr":
            points = f"[[0,1],[{onset},1],[{onset + LR_RAMP},{strength}]]"
            return ["optim.warmup_steps=0", f"optim.lr_points={points}"]
        if self.mechanism in ("mismatch", "mismatch+tis"):
            out = ["rollout.dtype=float32", f"rollout.sync_every={strength}"]
            if self.mechanism == "mismatch+tis":
                out.append("algo.rollout_correction.mode=tis")
            return out
        if self.mechanism == "tool":
            return [
                "retriever.degrade.kind=shuffled",
                f"retriever.degrade.start_step={onset + 1}",
                f"retriever.degrade.ramp_steps={strength}",
            ]
        if self.mechanism == "entropy":
            return [f"algo.entropy_coef={strength}"]
        raise ValueError(f"unknown mechanism {self.mechanism!r}")


CAUSES: dict[str, Cause] = {
    "lr": Cause("lr", ("optim",), ("10", "30")),
    "mismatch": Cause("mismatch", ("rollout", "algo.rollout_correction"), ("10", "25")),
    "mismatch+tis": Cause("mismatch+tis", ("rollout", "algo.rollout_correction"), ()),
    "tool": Cause("tool", ("retriever.degrade",), ("60", "120")),
    # amendment 1: the entropy grid extended between its first two values
    "entropy": Cause("entropy", ("algo.entropy_coef",), ("0.01", "0.02", "0.03", "0.05")),
}
CHOSEN: dict[str, str] = {"lr": "10", "mismatch": "10", "tool": "120", "entropy": "0.03"}
"""each mechanism's strength for the corpus, chosen by the pilot (PROTOCOL.md, amendments 1 and 2);
a mechanism not here refuses to run"""

ARMS = ("none", "lr", "mismatch", "mismatch+tis", "tool", "entropy")
"""the arms of seeds 0-7 (`none`: the control)"""
CAUSE_SEEDS = tuple(range(8))
HEALTHY_SEEDS = tuple(range(8, 24))
PILOT_SEED = 100
HELD_OUT = "tool"
"""the mechanism held out of all tuning (PROTOCOL.md, before any tuning)"""


def strength_of(arm: str) -> str:
    """The corpus's strength of `arm` (`mismatch+tis` takes `mismatch`'s lag)."""
    name = "mismatch" if arm == "mismatch+tis" else arm
    if name not in CHOSEN:
        raise SystemExit(
            f"{name}: no strength chosen yet: run the pilot (--pilot), then record its choice in "
            "PROTOCOL.md and CHOSEN (study.py)"
        )
    return CHOSEN[name]


def mechanism_of(arm: str) -> str:
    """The manifest's `mechanism` of an arm: the cause's name, `none` for controls and twins."""
    return "none" if arm in ("none", "mismatch+tis") else arm


def split_of(arm: str, seed: int) -> str:
    """`tune`, `judge` or `heldout` (PROTOCOL.md, fixed before tuning)."""
    if mechanism_of(arm) == HELD_OUT:
        return "heldout"
    if seed in HEALTHY_SEEDS:
        return "tune" if seed < 16 else "judge"
    return "tune" if seed < 4 else "judge"


def trunk_dir(seed: int, pilot: bool = False) -> Path:
    return WORK / ("pilot" if pilot else "corpus") / "trunk" / f"seed{seed}"


def branch_dir(arm: str, seed: int, pilot: bool = False) -> Path:
    return WORK / ("pilot" if pilot else "corpus") / arm_folder(arm) / f"seed{seed}"


def arm_folder(arm: str) -> str:
    """A folder name for an arm (`mismatch+tis` -> `mismatch_tis`, `lr@10` -> `lr_at_10`)."""
    return arm.replace("+", "_").replace("@", "_at_")


def base_overrides(seed: int, run_dir: Path) -> list[str]:
    """The recipe for `seed` in `run_dir`, from the committed warm start."""
    return [
        f"run_dir={run_dir}",
        f"seed={seed}",
        f"model.path={WARM / 'sft' / 'model'}",
        f"data.train={WARM / 'world' / 'train.jsonl'}",
        f"data.eval={WARM / 'world' / 'test.jsonl'}",
        f"retriever.source={WARM / 'world' / 'corpus.jsonl'}",
        *RECIPE,
    ]


def sha256_lines(root: Path) -> list[str]:
    """`sha256  relative/path` of every file under `root` but SHA256SUMS, sorted."""
    out = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != "SHA256SUMS"):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        out.append(f"{digest}  {path.relative_to(root).as_posix()}")
    return out


def check_warm_start() -> None:
    """Refuse to run from a warm start whose files differ from the committed checksums."""
    sums = WARM / "SHA256SUMS"
    if not sums.is_file():
        raise SystemExit(f"{sums}: missing; build the warm start first (warm_start.py)")
    if sha256_lines(WARM) != sums.read_text(encoding="utf-8").splitlines():
        raise SystemExit(f"{WARM}: files differ from {sums.name}; restore them from git")
