# The two set-up commands (see README): `make demo` and `make test`.
# Both create .venv if there is none and install what they need first.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
# The CPU wheel of this version lies on the CI/dev machines' disk; an unpinned
# torch would pull a multi-GB CUDA build. A machine that already has torch keeps it.
TORCH  ?= torch==2.13.0
DEMO_OUT ?= runs/demo

.PHONY: install demo test bench clean

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

bench: install
	MPLBACKEND=Agg $(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) runs
