"""Performance table of the MLA decode kernels (issue 4).

``python -m perf_table run`` measures on a GPU and writes a raw JSON under ``results/``;
``python -m perf_table regenerate`` rebuilds ``README.md``, ``table.csv`` and ``plots/`` from those
JSONs and the anchor CSVs in ``anchors/``, on any machine. Modules: ``grid`` (configs),
``formulas`` (bytes, FLOPs, roofline), ``anchors`` (other systems' numbers), ``bench`` (GPU timing),
``runner`` (the run), ``regenerate`` and ``plots`` (the table).
"""
