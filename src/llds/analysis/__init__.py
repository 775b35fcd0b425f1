"""Reading finished runs: what several studies, the benchmarks and a user comparing runs share.

Run logs as they are kept live or committed gzipped (`study_logs`), LLD shares pooled over
responses (`pooled`), one value per seed with its spread (`seeds`), exact tests for a handful of
seeds or paired questions (`significance`), two probes compared question by question
(`probe_compare`), held-out shares EM does not show (`eval_shares`), runs over mixed question
sources (`source_table`) and the machine line a measurement is printed with (`machine`). Each
study's own tables, answers and protocol constants live beside its protocol in `experiments/`.
"""
