from fedjax_dg.main import run

run()
