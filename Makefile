# make bench : create .venv if needed, install, run the quick suite (split_digits, embedded, no download; --jobs auto:
#              one run per core, 1 torch thread each)
# make test  : create .venv if needed, install, run the test suite
# make lint  : ruff
# make mutation : mutmut over the core modules, score per module + surviving mutants (docs/testing.md; slow)
# make lists : after changing a shipped strategy/scenario/model/callback/command module: rewrite the registries'
#              index (clbench/plugin_index.json, read by `clbench --help`/`list` instead of importing the modules;
#              tests/test_registry.py compares it)
# make docs  : build the documentation site into build/site/ (mkdocs --strict: a broken link or a missing page
#              fails); its reference and results pages are generated from the code and the records (clbench/docsite)
# make docs-serve : the same site, served at http://127.0.0.1:8000 and rebuilt on every edit
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DATA ?= $(if $(wildcard ../shared/data),../shared/data,)
export CLBENCH_DATA ?= $(DATA)
# sleeping (not spinning) OpenMP threads: see clbench/__init__.py
export OMP_WAIT_POLICY ?= PASSIVE
# torch is pinned to the tested build; pip takes it from the local wheel cache where one exists
TORCH := torch==2.14.1 torchvision==0.29.1

.PHONY: bench test lint mutation lists docs docs-serve venv clean-venv

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

bench: $(STAMP)
	$(PY) run_bench.py --suite quick

test: $(STAMP)
	$(PY) -m pytest -n 2 -p no:cacheprovider tests

lint: $(STAMP)
	$(VENV)/bin/ruff check clbench strategies scenarios tests benchmarks examples run_bench.py setup.py

mutation: $(STAMP)
	$(PY) tests/mutation_report.py --survivors

lists: $(STAMP)
	$(PY) -c "from clbench.plugins import write_index; write_index()"

# mkdocs 1.x prints a long notice about its successor on every build unless told not to
MKDOCS := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(VENV)/bin/mkdocs

docs: $(STAMP)
	$(MKDOCS) build --strict

docs-serve: $(STAMP)
	$(MKDOCS) serve

clean-venv:
	rm -rf $(VENV)
