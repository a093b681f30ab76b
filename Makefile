# The two commands of the README: `make demo` and `make test`. Both create .venv and
# install the package (with its test extras) on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell md5sum pyproject.toml | cut -c1-8)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $@

.PHONY: install demo test test-slow bench fashion-mnist docs
install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fedjax-dg --config configs/default.py --config.workdir=runs/demo-$(shell date +%Y%m%d-%H%M%S)

# Tests run in parallel processes (pytest-xdist), one per core, at most 4; the 25 slowest
# are listed at the end.
test: $(STAMP)
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadgroup --durations=25

test-slow: $(STAMP)
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadgroup --durations=25 -m slow

# The documentation site (docs/ -> site/), warnings as errors.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

bench: $(STAMP)
	$(PY) benchmarks/round_speed.py --out benchmarks/results/round_speed_cpu.json

# Debian's dataset-fashion-mnist package: the IDX files for configs/rotated_fashion_mnist.py.
fashion-mnist:
	bash scripts/install_fashion_mnist.sh
