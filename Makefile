# ringreduce: `make demo` and `make test` set everything up on a fresh machine.
PYTHON ?= python3
NP ?= 2
RRUN := $(PYTHON) -m ringreduce.launcher
STAMP := .make/installed-$(shell $(PYTHON) -c 'import sys; print(sys.prefix.replace("/", "_"))')

.PHONY: install demo test examples lint

install: $(STAMP)

# Reinstalls only when pyproject.toml changes (or for another Python environment).
$(STAMP): pyproject.toml
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -e '.[dev,mpich]'
	@mkdir -p .make && touch $@

demo: install
	$(RRUN) -np $(NP) $(PYTHON) examples/numpy_allreduce.py

test: install
	$(PYTHON) -m pytest

examples: install
	@set -e; for example in examples/*.py; do \
		echo "== $$example"; $(RRUN) -np $(NP) $(PYTHON) $$example; done

lint: install
	$(PYTHON) -m ruff check .
