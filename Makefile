# The two set-up commands (see README): `make demo` and `make test`.
# Both create .venv if there is none and install what they need first.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
# The CPU wheel of this version lies on the CI/dev machines' disk; an unpinned
# torch would pull a multi-GB CUDA build. A machine that already has torch keeps it.
TORCH  ?= torch==2.13.0
DEMO_OUT ?= runs/demo
NOTEBOOK_OUT ?= runs/notebook

.PHONY: install demo test bench notebook lint clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[optimizers,data,test]"
	$(PY) -m pip install -q -e ".[titan]"  # torchtitan (Python >= 3.11 only): tests/integrations
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) -m delaylab demo --out $(DEMO_OUT)

# Two workers (pytest-xdist), one test file each at a time: module fixtures are built once;
# the 25 slowest tests are listed at the end (where the time goes).
test: install
	MPLBACKEND=Agg OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile --durations=25

# docs/notebooks/check_assumptions.ipynb top to bottom without a browser (nbclient's jupyter-execute);
# the executed copy, outputs and figures included, goes to $(NOTEBOOK_OUT), never over the tracked notebook.
$(VENV)/.notebook: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[notebook]"
	touch $@

notebook: $(VENV)/.notebook
	mkdir -p $(NOTEBOOK_OUT)
	cd docs/notebooks && OMP_NUM_THREADS=1 $(abspath $(VENV))/bin/jupyter-execute --timeout=600 \
		--output=$(abspath $(NOTEBOOK_OUT))/check_assumptions check_assumptions.ipynb
	@echo "executed notebook: $(NOTEBOOK_OUT)/check_assumptions.ipynb"

$(VENV)/.dev: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

lint: $(VENV)/.dev
	$(PY) -m ruff check .

bench: install
	MPLBACKEND=Agg $(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) runs
