"""LLD diagnostics: likelihood and displacement metrics, phase detection, alarms, reports."""
