"""The benchmark layer above the runner (Bai et al. 2024): sweeps as data, launchers, collect to
tables, difficulty metrics, figures and the report. `python -m fedjax_dg.bench --help`."""
