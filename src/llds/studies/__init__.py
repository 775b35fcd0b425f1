"""The studies' logic: pure functions from runs' logged rows (and, for the warm starts, a
model's measurements) to the tables and pre-registered answers of `experiments/`. Above
`llds.report` (they use its collapse definition, attribution and committed-log reader), below
the experiment drivers, which keep only argument parsing and orchestration."""
