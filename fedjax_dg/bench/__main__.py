from fedjax_dg.bench.cli import run

run()
