"""What is measured inside the training loop from tensors and metric rows: LLD, rollout
statistics, phases and alarms.

Nothing here imports the trainer, so the TRL and veRL adapters can use it as the native trainer
does. A new alarm is a detector registered with `register_detector` (docs/diagnostics.md,
"Adding a detector")."""

from llds.monitor.registry import (
    MECHANISMS,
    DetectorSettings,
    Firing,
    StepView,
    register_detector,
    registered_detectors,
)

__all__ = [
    "MECHANISMS",
    "DetectorSettings",
    "Firing",
    "StepView",
    "register_detector",
    "registered_detectors",
]
