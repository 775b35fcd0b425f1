"""What a run was trained with and how it scored on held-out questions, for `llds report`.

Two runs that differ only by their label say nothing; the report needs each run's settings (from
the config the run saved) and its held-out EM over training, measured from where it started.
Everything here reads files and never imports torch, so a report renders on any machine.

Where things are kept:
- settings: `RUN/config.yaml` (what `llds demo` writes) or, failing that, the `config` of the
  newest `RUN/checkpoints/step_N/trainer_state.json` (what every trainer checkpoint holds);
- evaluations: `RUN/eval/step_N.json` (`llds.runs.eval_result.eval_file`), or a single
  `RUN/eval.json`: an older run's final evaluation, or a study's `{"step_N": {scores}}` (its
  evaluations by step, scores only); the starting EM is
  the run's own step-0 evaluation or, failing that, the warm start's: the model directory the
  config names, with its evaluation at `MODEL/../eval/step_000000.json` (the SFT output layout
  the demo writes) or, for a checkpoint `OTHER/checkpoints/step_N/model`, `OTHER/eval/step_N.json`.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llds.errors import DataFormatError
from llds.runs.eval_result import EvalResult, eval_file, eval_files

CONFIG_FILE = "config.yaml"
LEGACY_EVAL_FILE = "eval.json"
TRAINER_STATE = "trainer_state.json"

KEY_SETTINGS: tuple[tuple[str, str], ...] = (
    ("model.path", "start model"),
    ("model.dtype", "dtype"),
    ("model.lora", "LoRA"),
    ("seed", "seed"),
    ("steps", "training steps"),
    ("prompts_per_step", "prompts per step"),
    ("rollout.group_size", "group size (rollouts per prompt)"),
    ("rollout.max_turns", "max search turns"),
    ("rollout.temperature", "sampling temperature"),
    ("optim.lr", "learning rate"),
    ("optim.schedule", "lr schedule"),
    ("optim.mini_batches", "mini-batches per step"),
    ("optim.epochs", "epochs per step"),
    ("optim.grad_clip", "gradient clip"),
    ("algo.clip_low", "PPO clip"),
    ("algo.kl_coef", "KL coefficient"),
    ("algo.llds.enabled", "LLDS regularizer"),
    ("algo.llds.coef", "LLDS coefficient"),
    ("algo.llds.gate", "LLDS gate"),
    ("algo.llds.mask_answer", "LLDS-MA (answer weighted)"),
    ("algo.llds.scope", "LLDS scope"),
    ("rollout.dtype", "sampling copy dtype"),
    ("algo.rollout_correction.mode", "rollout correction"),
    ("algo.rollout_correction.level", "correction level"),
    ("algo.rollout_correction.cap", "correction cap"),
    ("algo.filter_void_turns", "void-turn filter"),
    ("algo.clip_high", "clip-higher"),
    ("diagnostics.on_alarm", "on alarm"),
)
"""The settings the report always lists, as (dotted config key, what to call it)."""

IGNORED_DIFFERENCES = frozenset({"run_dir"})
"""Keys that differ between any two runs by construction, so they tell nothing apart."""


@dataclass(frozen=True)
class EvalPoint:
    """Held-out exact match of a model after `step` training steps, on `n` questions."""

    step: int
    em: float
    n: int
    source: Path
    by_set: tuple[tuple[str, float, int], ...] = ()
    """(question source, EM, questions) per source tag of the evaluated questions, when they
    come from more than one (e.g. held-out and transfer): the overall EM pools them."""


@dataclass(frozen=True)
class HeldOut:
    """A run's held-out EM over training and the EM it started from (None: unknown)."""

    points: tuple[EvalPoint, ...]
    baseline: EvalPoint | None
    baseline_label: str = ""
    """where the starting EM comes from: 'step-0 evaluation' or 'warm start'"""


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise DataFormatError(f"{path}: not valid YAML ({exc})") from exc


def _newest_trainer_state(run_dir: Path) -> Path | None:
    """The checkpoint with the highest step that has a trainer state (names sort by step)."""
    states = sorted((run_dir / "checkpoints").glob(f"step_*/{TRAINER_STATE}"))
    return states[-1] if states else None


def saved_config(run_dir: str | Path) -> tuple[dict[str, Any] | None, Path | None]:
    """`(the run's saved training config as a nested dict, the file it came from)`, or
    `(None, None)` when it saved none."""
    run = Path(run_dir)
    if (run / CONFIG_FILE).is_file():
        data, where = _read_yaml(run / CONFIG_FILE), run / CONFIG_FILE
    else:
        state = _newest_trainer_state(run)
        if state is None:
            return None, None
        try:
            data = json.loads(state.read_text(encoding="utf-8")).get("config")
        except (json.JSONDecodeError, AttributeError) as exc:
            raise DataFormatError(f"{state}: not a trainer state ({exc})") from exc
        where = state
        if data is None:
            return None, None
    if not isinstance(data, Mapping):
        raise DataFormatError(f"{where}: the config is not a mapping")
    return dict(data), where


def load_config(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's saved training config as a nested dict, or None when it saved none."""
    return saved_config(run_dir)[0]


def saved_monitor(run_dir: str | Path) -> tuple[dict[str, Any] | None, Path | None]:
    """`(the monitor section of the run's saved config, the file)`; `(None, file)` when the
    config was saved before the monitor had settings, `(None, None)` with no saved config."""
    config, where = saved_config(run_dir) if Path(run_dir).is_dir() else (None, None)
    section = (config or {}).get("monitor")
    return (dict(section) if isinstance(section, Mapping) else None), where


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested sections to dotted keys (`{"optim": {"lr": 1}}` -> `{"optim.lr": 1}`), so runs
    can be compared key by key."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def differing_keys(configs: Sequence[Mapping[str, Any] | None]) -> list[str]:
    """Dotted keys whose value is not the same in every run that saved a config (a key missing
    from some config counts as a difference); empty with fewer than two such runs."""
    flat = [flatten(c) for c in configs if c is not None]
    if len(flat) < 2:
        return []
    names = sorted({k for f in flat for k in f} - IGNORED_DIFFERENCES)
    missing = object()
    return [k for k in names if len({json.dumps(f.get(k, missing), default=str) for f in flat}) > 1]


def settings_rows(configs: Sequence[Mapping[str, Any] | None]) -> list[tuple[str, str, bool]]:
    """(dotted key, display name, differs) for the settings table: the key settings first, then
    every other key that differs across runs (those are what tell the runs apart)."""
    differ = differing_keys(configs)
    flat = [flatten(c) for c in configs if c is not None]
    rows = [
        (key, name, key in differ)
        for key, name in KEY_SETTINGS
        if any(key in f for f in flat) or key in differ
    ]
    listed = {key for key, _ in KEY_SETTINGS}
    rows += [(key, key, True) for key in differ if key not in listed]
    return rows


def format_setting(value: Any) -> str:
    """A config value as a short string: on/off for switches, `2e-05` for small floats."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping | list):
        return json.dumps(value, default=str)
    return str(value)


def resolve_model_dir(run_dir: str | Path, config: Mapping[str, Any] | None) -> Path | None:
    """The local model directory the run started from, or None (a hub name, or not found).

    The config holds the paths as they were given when training ran, often relative to another
    working directory. The start model's place relative to the run directory survives moving the
    whole tree (runs/demo/grpo -> ../sft/model), so that is tried first, then the path as given.
    """
    model = (config or {}).get("model")
    raw = model.get("path") if isinstance(model, Mapping) else None
    if not isinstance(raw, str) or not raw:
        return None
    given = Path(raw)
    candidates = []
    saved_run = (config or {}).get("run_dir")
    if isinstance(saved_run, str) and saved_run and given.is_absolute() == os.path.isabs(saved_run):
        candidates.append(Path(run_dir) / os.path.relpath(given, saved_run))
    candidates.append(given)
    found = next((c for c in candidates if c.is_dir()), None)
    return Path(os.path.normpath(found)) if found is not None else None


def warm_start_eval_file(model_dir: Path) -> Path | None:
    """Where the evaluation of a start model is kept, if it was evaluated (see module doc)."""
    candidates = [eval_file(model_dir.parent, 0)]
    ckpt = model_dir.parent
    digits = ckpt.name.removeprefix("step_")
    if ckpt.name.startswith("step_") and digits.isdigit() and ckpt.parent.name == "checkpoints":
        candidates.append(eval_file(ckpt.parent.parent, int(digits)))
    return next((c for c in candidates if c.is_file()), None)


STUDY_EVAL_KEY = re.compile(r"step_(\d+)")
"""A key of a study's `eval.json`: the step its scores were measured after."""


def read_eval_json(path: Path, last_step: int) -> list[tuple[int, EvalResult]]:
    """The evaluations in a run's single `eval.json`, by step: a study's `{"step_N": {scores}}`
    gives one per key; an `EvalResult` file (an older run's final evaluation) is placed at
    `last_step`."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"{path}: not valid JSON ({exc})") from exc
    if isinstance(data, Mapping) and data and all(STUDY_EVAL_KEY.fullmatch(str(k)) for k in data):
        found = []
        for key, scores in data.items():
            step = int(STUDY_EVAL_KEY.fullmatch(str(key)).group(1))  # type: ignore[union-attr]
            found.append((step, EvalResult.from_dict({"overall": scores}, f"{path}: {key}")))
        return sorted(found, key=lambda pair: pair[0])
    return [(last_step, EvalResult.from_dict(data, str(path)))]


def _point(step: int, path: Path, result: EvalResult | None = None) -> EvalPoint | None:
    """The overall EM in an evaluation (read from `path` unless given); None when it scored
    no question."""
    result = result if result is not None else EvalResult.read(path)
    overall = result.overall
    if overall.n == 0 or math.isnan(overall.em):
        return None
    sets = tuple(
        (name, scores.em, scores.n)
        for name, scores in result.by_source.items()
        if scores.n and not math.isnan(scores.em)
    )
    return EvalPoint(step, overall.em, overall.n, path, sets if len(sets) > 1 else ())


def held_out(run_dir: str | Path, config: Mapping[str, Any] | None, last_step: int) -> HeldOut:
    """The run's held-out EM by step and its starting EM.

    A run written before the `eval/step_N.json` convention has a single `eval.json`
    (`read_eval_json`): a study's evaluations by step, or the final model's, placed at
    `last_step`."""
    run = Path(run_dir)
    files = eval_files(run)
    found = [p for p in (_point(step, path) for step, path in files) if p is not None]
    legacy = run / LEGACY_EVAL_FILE
    if not files and legacy.is_file():
        points = (_point(step, legacy, r) for step, r in read_eval_json(legacy, last_step))
        found = [p for p in points if p is not None]
    start = next((p for p in found if p.step == 0), None)
    if start is not None:
        return HeldOut(tuple(found), start, "step-0 evaluation")
    model = resolve_model_dir(run, config)
    warm = warm_start_eval_file(model) if model is not None else None
    baseline = _point(0, warm) if warm is not None else None
    return HeldOut(tuple(found), baseline, "warm start" if baseline is not None else "")
