"""What is measured inside the training loop from tensors and metric rows: LLD, rollout
statistics, phases and alarms.

Nothing here imports the trainer, so the TRL and veRL adapters can use it as the native trainer
does."""
