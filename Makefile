# Mario Ape-X. `make run` trains, `make test` tests; everything installs itself into .venv first.
# PYTHON selects the interpreter (make test PYTHON=python3.13); each interpreter gets its own venv.
PYTHON ?= python3
PY_TAG := $(shell $(PYTHON) -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")' 2>/dev/null)
VENV ?= .venv$(if $(filter 311,$(PY_TAG)),,-py$(PY_TAG))
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=
BENCH_ARGS ?=
PYTEST_ARGS ?=
CHECKPOINT ?=
export OMP_NUM_THREADS ?= 1
export OMP_WAIT_POLICY ?= PASSIVE
export MKL_NUM_THREADS ?= 1

.PHONY: install test test-fast test-env run bench eval lint keys clean

install: $(STAMP)

# Re-install only when the requirements change: a no-op run costs a stat.
$(STAMP): setup.cfg pyproject.toml
	@test -n "$(PY_TAG)" || { echo "error: PYTHON=$(PYTHON) is not a working Python interpreter" >&2; exit 2; }
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade "pip>=23" 2>&1 | grep -v '^WARNING: Location' || true
	$(VPY) -m pip install --quiet -e ".[dev]" 2>&1 | grep -v '^WARNING: Location' || true
	@$(VPY) -c "import shared, replay, actors, learner, nes_py, gym_super_mario_bros, zmq, cv2" \
		|| { echo "error: install incomplete in $(VENV)" >&2; exit 1; }
	@touch $(STAMP)

# Everything CI runs: unit, property, real-emulator, multi-process and learning tests.
test: install
	$(VPY) -m pytest $(PYTEST_ARGS)

# Inner loop: skip the slow mark.
test-fast: install
	$(VPY) -m pytest -m "not slow" $(PYTEST_ARGS)

# Environment tests only (no torch needed): used for the Python 3.13 emulator generation, which
# gets no torch here. Listed by file: collecting the other modules would import torch.
ENV_TESTS := tests/test_env_mario.py tests/test_env_factory.py tests/test_config.py tests/test_chunk.py tests/test_boundaries.py
test-env: install
	$(VPY) -m pytest -m envonly $(ENV_TESTS) $(PYTEST_ARGS)

run: install
	$(VPY) -m launcher $(ARGS)

bench: install
	$(VPY) -m bench $(BENCH_ARGS)

eval: install
	@test -n "$(CHECKPOINT)" || { echo "usage: make eval CHECKPOINT=runs/<run>" >&2; exit 2; }
	$(VPY) -m evaluate $(CHECKPOINT) $(ARGS)

lint: install
	$(VPY) -m ruff check .

keys: install
	$(VPY) -m shared.keys $(if $(KEYS_DIR),--dir $(KEYS_DIR),)

clean:
	rm -rf .venv .venv-py* runs/bench .pytest_cache
