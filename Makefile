# fedmtl: every target sets up what it needs. `make test` on a fresh clone installs first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install demo test lint format clean benchmark benchmark-privacy docs

install: $(STAMP)

# torch==2.14.1 / torchvision==0.29.1 are pinned in pyproject.toml: pip on Python 3.11 takes
# that pair from the machine's local copy; other versions would download gigabytes.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The embedded demo: writes its synthetic data on first use, trains 10 rounds, prints the metrics.
# It resumes: a second `make demo` continues an interrupted demo or reprints a finished one.
demo: install
	$(VENV)/bin/fedmtl fit --config configs/demo.yaml --resume true

# The method benchmark (docs/benchmark.md): every method x 3 seeds on generated data in
# the shape of scenario 1 (BENCHMARK=scenario2 for the other), one CPU thread per run, 2 runs at
# a time, then the Δm report in runs/benchmark/$(BENCHMARK)/ and benchmarks/results/. Restartable:
# finished runs are kept.
BENCHMARK ?= scenario1
benchmark: install
	$(PY) benchmarks/compare_methods.py --config configs/benchmark/$(BENCHMARK).yaml \
		--seeds 0 1 2 --jobs 2 --out runs/benchmark/$(BENCHMARK)

# The privacy-utility benchmark (docs/benchmark.md): FedAvg, FedPer (central DP) and FedHCA² (local
# DP) at noise multipliers 0.3, 1 and 3, and Local, x 3 seeds on scenario 1's benchmark config;
# Δm against ε in benchmarks/results/privacy_utility.md and .png. Restartable like `benchmark`.
benchmark-privacy: install
	$(PY) benchmarks/privacy_utility.py --jobs 2 --out runs/benchmark/privacy

# One pytest worker per core (at most 4), each taking whole test files, so a module's shared runs
# are computed once.
test: install
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile

# The documentation site from docs/ into site/ (open site/index.html); warnings are errors.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site
