"""Studies: which variant wins at which budget, and what that answer can stand behind.

A study is a sweep over sizes (``model.*``) and budgets (``train.max_flops``), often trained
once through cooldown branches (`llmlab.train.branches`). `llmlab report` reads its runs:

- `design`: the axes, the variants and the design's cells, read from the runs' overrides;
- `surface`, `optimum`, `frontier`: the fitted laws (L(N, D), the compute-optimal size, the
  best loss against the budget);
- `holdout` and `calibration`: each law fitted without the largest budget predicts it, with
  an interval that allows for the law's own error, and the decisions taken from it;
- `section` and `markdown`: the report's scaling section, its words and its figure;
- `report` and `tables`: the report over groups of runs (seeds, baselines, curves).
"""
