"""Deciding how a run starts over an existing run directory.

Three rules, so that no step is lost, repeated or silently trained with other settings:

* resume from the newest checkpoint that verifies (`llds.train.checkpoint.find_resumable`);
  damaged newer ones are set aside, and the records of steps after the resumed one (alarms,
  evaluations; the metrics log is cut by `MetricsLogger`) are dropped, so that every step
  appears once;
* a run directory that holds an earlier run is never trained over from step 0 unless asked
  (`resume=False` / `--no-resume`), and then the earlier run is renamed aside, not deleted;
* a resume whose config differs from the checkpoint's is refused, listing the changed keys,
  unless each is allowed (`allow_config_change`); `ALWAYS_ALLOWED` keys need no permission;
  one on another floating-point environment (`llds.policy.float_env`) goes on with a warning.

Pure helpers (what changed, what is allowed, the messages) are separate from the few
functions that touch the file system.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from llds.config.loader import config_changes, deep_merge, dotted_keys, to_dict
from llds.errors import UserInputError
from llds.io import write_jsonl
from llds.policy.float_env import float_environment, resume_warning
from llds.runs.eval_result import eval_files
from llds.runs.tracking import METRICS_FILE, read_metrics
from llds.train.checkpoint import (
    LATEST,
    TRAINER_STATE,
    checkpoint_dirs,
    point_latest,
    read_trainer_state,
    remove_staging_leftovers,
)
from llds.train.config import TrainConfig
from llds.train.distributed import Dist

ALWAYS_ALLOWED = (
    "steps",
    "run_dir",
    "threads",
    "save_every",
    "keep_checkpoints",
    "logging",
    "make_inputs",
    "rollout.cache",
    "rollout.compile",
    "optim.micro_batch_tokens",
    "optim.logprob_micro_batch_tokens",
)
"""Keys a resume may change without permission: none of them changes what a step computes.
`steps` extends (or shortens) the run; with a decaying schedule or `optim.warmup_ratio` the
learning rate of the remaining steps follows the new total. `run_dir` changes when a run
directory is moved; `threads`, checkpointing and logging change how, not what, is trained;
so do the decode loop's cache and compilation (`rollout.cache`, `rollout.compile`), whose
rollouts are the eager loop's token for token (tested), up to float rounding as with `threads`
(a run begun before `compile` defaulted to `auto` resumes without asking), and the micro-batch
token budgets, whose gradients and log-probs add up to the same values (tested)."""

ALL = "all"

log = logging.getLogger("llds.train")
ALARMS_FILE = "alarms.jsonl"
DAMAGED_PREFIX = "damaged-"
LR_KEYS = ("optim.lr", "optim.schedule", "optim.warmup_steps", "optim.warmup_ratio", "steps")
"""Keys whose change moves the learning rate of the next step."""
OPTIM_KEYS = {"optim.weight_decay": "weight_decay", "optim.eps": "eps", "optim.betas": "betas"}
"""Config keys stored in the optimizer's param groups (and restored from a checkpoint's)."""

Change = tuple[str, Any, Any]
FLOAT_ENV_KEY = "float_env"
"""The trainer state's record of `llds.policy.float_env.float_environment()`."""


# ------------------------------------------------------------------ config changes (pure)


def parse_allowances(spec: str | Iterable[str] | None) -> tuple[str, ...]:
    """`"optim.lr,rollout.group_size"` or `["optim.lr", "steps"]` -> a tuple of dotted keys
    (sections allow every key below them; `all` allows everything)."""
    if spec is None:
        return ()
    items = [spec] if isinstance(spec, str) else list(spec)
    return tuple(key.strip() for item in items for key in item.split(",") if key.strip())


def check_allowances(allow: Sequence[str], config: dict[str, Any]) -> None:
    """Every allowed key must name a key or section of the config (a typo allows nothing)."""
    known = dotted_keys(config)
    unknown = [key for key in allow if key != ALL and key not in known]
    if unknown:
        raise UserInputError(
            f"allow_config_change: {', '.join(unknown)} is not a config key "
            "(dotted keys such as optim.lr or rollout.group_size, a section, or all)"
        )


def is_allowed(key: str, allow: Sequence[str]) -> bool:
    """Whether `key` is covered by an entry of `allow` (itself, a section above it, or all)."""
    return any(entry == ALL or key == entry or key.startswith(entry + ".") for entry in allow)


def _plain(obj: Any) -> Any:
    """A config as JSON gives it back (tuples as lists, keys as strings): the saved config was
    read from JSON, so only this form compares equal."""
    return json.loads(json.dumps(to_dict(obj)))


def resume_changes(
    saved: dict[str, Any], requested: Any, defaults: Any
) -> tuple[list[Change], list[Change]]:
    """`(allowed without asking, needing permission)`: the keys of the requested config that
    differ from the checkpoint's. Keys the saved config lacks (written by an older version)
    count as their default, so a new option is not a change."""
    old = deep_merge(_plain(defaults), saved)
    changes = config_changes(old, _plain(requested))
    free = [c for c in changes if is_allowed(c[0], ALWAYS_ALLOWED)]
    asked = [c for c in changes if not is_allowed(c[0], ALWAYS_ALLOWED)]
    return free, asked


def describe(changes: Sequence[Change]) -> str:
    """`optim.lr: 0.001 -> 0.01, rollout.group_size: 3 -> 4`."""
    return ", ".join(f"{key}: {_show(old)} -> {_show(new)}" for key, old, new in changes)


def _show(value: Any) -> str:
    """A config value as it would be written in JSON (null, true, "text", [0.9, 0.999])."""
    return json.dumps(value)


def refused_change_message(ckpt: Path, refused: Sequence[Change]) -> str:
    """The one-line refusal of a resume with changed keys, and how to allow them."""
    keys = ",".join(key for key, _, _ in refused)
    return (
        f"resuming from {ckpt} with a changed config: {describe(refused)}. To resume with "
        f"these changes, add --allow-config-change {keys} (or all; allow_config_change= in "
        f"Python); to resume unchanged, drop them (the saved config is in {ckpt.name}/"
        f"{TRAINER_STATE}); to start again, --no-resume"
    )


# ------------------------------------------------------------------ the run directory


def previous_run_contents(run_dir: Path) -> list[str]:
    """What of an earlier run `run_dir` holds (metrics rows, checkpoints, evaluations,
    alarms), described for a message; empty for a fresh or absent directory."""
    found = []
    rows = read_metrics(run_dir) if (run_dir / METRICS_FILE).is_file() else []
    if rows:
        found.append(f"{METRICS_FILE} up to step {rows[-1].get('step')}")
    ckpt_root = run_dir / "checkpoints"
    ckpts = checkpoint_dirs(ckpt_root)
    if ckpts:
        found.append(f"checkpoints {', '.join(p.name for p in ckpts)}")
    elif ckpt_root.is_dir() and any(ckpt_root.iterdir()):
        found.append("a checkpoints/ directory")
    evals = eval_files(run_dir)
    if evals:
        found.append(f"{len(evals)} evaluation(s) in eval/")
    alarms = run_dir / ALARMS_FILE
    if alarms.is_file() and alarms.stat().st_size:
        found.append(ALARMS_FILE)
    return found


def no_checkpoint_message(
    run_dir: Path, contents: Sequence[str], damaged: Sequence[tuple[Path, str]]
) -> str:
    """The one-line refusal to train from step 0 over an earlier run without a checkpoint."""
    why = "; ".join(f"{p.name}: {problem}" for p, problem in damaged)
    which = f"no valid checkpoint (damaged: {why})" if damaged else "no checkpoint"
    return (
        f"{run_dir} holds an earlier run ({', '.join(contents)}) but {which} to resume from; "
        f"to start again from step 0, run with --no-resume (resume=False in Python): the "
        f"earlier run is then moved to {run_dir.name}.old-<time> beside it, nothing is deleted"
    )


def aside_path(run_dir: Path, stamp: str) -> Path:
    """A free sibling name for an earlier run: `RUN.old-<stamp>`, `RUN.old-<stamp>-2`, ..."""
    candidate = run_dir.with_name(f"{run_dir.name}.old-{stamp}")
    n = 2
    while candidate.exists():
        candidate = run_dir.with_name(f"{run_dir.name}.old-{stamp}-{n}")
        n += 1
    return candidate


def move_run_aside(run_dir: Path) -> Path:
    """Rename the whole run directory to `aside_path` (one rename: nothing is copied or lost);
    the new run starts in a fresh directory of the old name."""
    target = aside_path(run_dir, time.strftime("%Y%m%d-%H%M%S"))
    try:
        os.rename(run_dir, target)
    except OSError as exc:
        raise UserInputError(
            f"{run_dir}: cannot move the earlier run aside to {target} ({exc.strerror}); "
            "move or delete it yourself, or choose another run_dir"
        ) from None
    return target


def set_aside_damaged(damaged: Sequence[tuple[Path, str]]) -> list[Path]:
    """Rename each damaged checkpoint to `damaged-step_N` beside it: out of the way of the
    checkpoints the resumed run writes and prunes, but kept for inspection."""
    moved = []
    for path, _ in damaged:
        target = path.with_name(f"{DAMAGED_PREFIX}{path.name}")
        n = 2
        while target.exists():
            target = path.with_name(f"{DAMAGED_PREFIX}{path.name}-{n}")
            n += 1
        os.rename(path, target)
        moved.append(target)
    return moved


def trim_records_after(run_dir: Path, step: int) -> list[str]:
    """Drop the alarms and evaluations of steps after `step` (the resumed run redoes them);
    returns what was dropped, for the log. The metrics log is cut by `MetricsLogger`."""
    dropped = []
    alarms = run_dir / ALARMS_FILE
    if alarms.is_file():
        rows = _jsonl_rows(alarms)
        kept = [r for r in rows if int(r.get("step", 0)) <= step]
        if len(kept) < len(rows):
            write_jsonl(alarms, kept)
            dropped.append(f"{len(rows) - len(kept)} alarm(s)")
    for n, path in eval_files(run_dir):
        if n > step:
            path.unlink()
            dropped.append(f"eval/{path.name}")
    return dropped


def _jsonl_rows(path: Path) -> list[dict[str, Any]]:
    """The complete JSON object rows of a log (a torn last line from a crash is dropped)."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


# ------------------------------------------------------------------ optimizer settings


def apply_optimizer_changes(optimizer, scheduler, cfg: Any, changed: Iterable[str]) -> None:
    """Make allowed changes of optimizer settings take effect after a checkpoint was loaded.

    `optimizer.load_state_dict` brings back the saved param-group values (lr, betas, ...) and
    the scheduler its saved base learning rates; without this an allowed `optim.lr` change
    would be ignored. Only changed keys are touched, so an unchanged resume stays exact."""
    changed = set(changed)
    for key, name in OPTIM_KEYS.items():
        if key in changed:
            value = _optim_value(cfg, name)
            for group in optimizer.param_groups:
                group[name] = value
    if "optim.lr" in changed:
        scheduler.base_lrs = [cfg.optim.lr for _ in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["initial_lr"] = cfg.optim.lr
    if changed & set(LR_KEYS):  # the next step's rate under the (new) schedule
        last = scheduler.last_epoch
        for group, base, factor in zip(
            optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True
        ):
            group["lr"] = base * factor(last)
        scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


def _optim_value(cfg: Any, name: str) -> Any:
    value = getattr(cfg.optim, name)
    return tuple(value) if name == "betas" else value


def checked_config_changes(
    cfg: TrainConfig, ckpt: Path | None, allow: Sequence[str], *, report: bool
) -> set[str]:
    """The config keys that differ from checkpoint `ckpt`'s; refused (UserInputError) unless
    each is allowed by `allow` or always allowed. Runs before any model is loaded; `report`
    logs the accepted changes (the main process only)."""
    check_allowances(allow, to_dict(cfg))
    if ckpt is None:
        return set()
    saved = read_trainer_state(ckpt).get("config") or {}
    free, asked = resume_changes(saved, cfg, TrainConfig())
    refused = [c for c in asked if not is_allowed(c[0], allow)]
    if refused:
        raise UserInputError(refused_change_message(ckpt, refused))
    if free and report:
        log.info("resuming with %s (always allowed)", describe(free))
    if asked and report:
        log.warning("resuming with config changes (allowed): %s", describe(asked))
    return {key for key, _, _ in free + asked}


def warn_if_float_env_changed(ckpt: Path | None) -> None:
    """Log a warning when checkpoint `ckpt` was written under another torch build, CPU kernel
    set, accelerator or thread count than this process has (the main process only)."""
    if ckpt is None:
        return
    saved = read_trainer_state(ckpt).get(FLOAT_ENV_KEY) or {}
    warning = resume_warning(saved, float_environment())
    if warning:
        log.warning(warning)


def prepare_run_dir(
    run_dir: Path,
    ckpt: Path | None,
    damaged: Sequence[tuple[Path, str]],
    *,
    resume: bool,
    dist: Dist,
) -> None:
    """Once every input has loaded, before anything is written: refuse to train from step
    0 over an earlier run (unless `resume=False`, which moves it aside), and on a resume
    set damaged checkpoints aside and drop the records of the steps about to be redone."""
    contents = previous_run_contents(run_dir)
    if resume and ckpt is None and contents:
        raise UserInputError(no_checkpoint_message(run_dir, contents, damaged))
    if dist.is_main:
        if not resume and contents:
            aside = move_run_aside(run_dir)
            log.warning(
                "--no-resume: moved the earlier run in %s to %s; starting at step 0",
                run_dir,
                aside,
            )
        elif ckpt is not None:
            _clean_up_for_resume(run_dir, ckpt, damaged)
    dist.barrier()


def _clean_up_for_resume(run_dir: Path, ckpt: Path, damaged: Sequence[tuple[Path, str]]) -> None:
    """Damaged checkpoints aside, `latest` naming `ckpt`, later records dropped, the temporary
    directories of checkpoints whose writer died removed."""
    for name in remove_staging_leftovers(ckpt.parent):
        log.warning("removed %s, an unfinished checkpoint of an earlier process", name)
    moved = set_aside_damaged(damaged)
    for (path, problem), aside in zip(damaged, moved, strict=True):
        log.warning("checkpoint %s is damaged (%s): skipped, kept as %s", path, problem, aside.name)
    ckpt_root = ckpt.parent
    pointer = ckpt_root / LATEST
    named = pointer.read_text(encoding="utf-8").strip() if pointer.is_file() else None
    if named != ckpt.name:
        point_latest(ckpt_root, ckpt)
        log.warning(
            "checkpoint pointer %s named %s; resuming from %s, the newest valid checkpoint",
            pointer,
            named or "nothing (missing)",
            ckpt.name,
        )
    step = int(read_trainer_state(ckpt)["step"])
    dropped = trim_records_after(run_dir, step)
    if dropped:
        log.warning("dropped the records of steps after %d: %s", step, ", ".join(dropped))
