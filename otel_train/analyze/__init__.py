"""Reading what otel_train wrote and answering questions with it: `otel-train diagnose`, `report`,
`export --format perfetto`.

`reader` streams spans and metric points from the embedded default's files or an OTLP JSON lines
dump; `model` reduces them to one record per rank and step; `skew`, `stragglers`, `slow`,
`goodput`/`accounting` and `verdicts` are the analyses; `diagnose` runs them, `text`, `report`
and `perfetto` present them; `commands` is the CLI. `slow` and `goodput` are pure (standard
library, no I/O) so the exporter process can apply the same rules at run time.
"""
