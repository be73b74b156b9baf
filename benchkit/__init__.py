"""The benchmarks' kit: what `kvgate bench --compare` (the real stack) and `kvgate simulate` and
`plan` (the model) share, below both so neither imports the other: the engine-fleet flags
(`fleet_options`), the inputs checked before a run (`inputs`), the routing modes compared
(`modes`) and the per-mode results with their reports: JSON, markdown table, PNG chart
(`report`)."""
