# Mario Ape-X. `make run` trains, `make test` tests; everything installs itself into .venv first.
# PYTHON selects the interpreter (make test PYTHON=python3.13); each interpreter gets its own venv.
PYTHON ?= python3
PY_TAG := $(shell $(PYTHON) -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")' 2>/dev/null)
VENV ?= .venv$(if $(filter 311,$(PY_TAG)),,-py$(PY_TAG))
VPY := $(VENV)/bin/python
# Optional extras on top of dev, comma-separated: EXTRAS=ray for `--launcher ray` (CI installs it for the Ray test),
# EXTRAS=retro for env.backend=retro (CI installs it for the backend equivalence tests).
EXTRAS ?=
# env.backend=retro: stable-retro's FCEUmm NES core, wheels for CPython 3.11-3.13 (manylinux x86_64, 244 MB
# installed; the core is GPLv2, the wrapper MIT), pinned in requirements-retro.txt and installed with --no-deps
# (why: that file). Changing the file re-installs, as changing setup.cfg does.
RETRO_REQUIREMENTS := requirements-retro.txt
comma := ,
# Python >= 3.13 gets no torch by default (setup.cfg): the env tests (test-env) run without it, so only
# the targets that train (run, bench, eval) add the torch extra there. Below 3.13 torch is a requirement.
TORCH_EXTRA := $(shell test "$(PY_TAG)" -ge 313 2>/dev/null && echo torch)
# One stamp per set of extras (.installed-dev, .installed-dev-ray, ...): switching sets installs only what is missing.
extras_tag = $(subst $(comma),-,$(subst $(eval) ,,$(strip dev $(if $(1),$(comma)$(1)) $(if $(EXTRAS),$(comma)$(EXTRAS)))))
STAMP := $(VENV)/.installed-$(call extras_tag,)
TRAIN_STAMP := $(VENV)/.installed-$(call extras_tag,$(TORCH_EXTRA))
ARGS ?=
BENCH_ARGS ?=
PYTEST_ARGS ?=
CHECKPOINT ?=
export OMP_NUM_THREADS ?= 1
export OMP_WAIT_POLICY ?= PASSIVE
export MKL_NUM_THREADS ?= 1

.PHONY: install test test-random test-fast test-env test-experiments run bench bench-remote soak soak-net eval suite lint keys clean record-golden record-scale-chunks \
	wheelhouse wheelhouse-nes-py9 help

install: $(STAMP)

# One line per target (tests/test_make_help.py checks that every .PHONY target is listed).
help:
	@echo "make run          train (Mario 1-1, the auto profile) until Ctrl-C; options via ARGS=\"...\" (docs/training.md)"
	@echo "make test         the whole test suite, what CI runs (docs/testing.md)"
	@echo "make test-fast    the suite without the slow mark"
	@echo "make test-random  the suite in a random order"
	@echo "make test-env     the environment tests only (no torch needed)"
	@echo "make test-experiments  the research tools' tests (experiments/), which make test leaves out"
	@echo "make lint         ruff over the repository"
	@echo "make eval         play a checkpoint: CHECKPOINT=runs/<run> ARGS=\"--epsilon 0.05\" (docs/evaluation.md)"
	@echo "make suite        checkpoints x levels x evaluation seeds: CHECKPOINT=\"runs/a runs/b\" ARGS=\"--levels 1-1 --out DIR\""
	@echo "make levels       train and ship levels until cleared: LEVELS=\"2-1 3-1\" HOURS=4 per level (docs/CHECKPOINTS.md)"
	@echo "make bench        throughput against the emulator ceiling and the naive design (BENCHMARKS.md)"
	@echo "make bench-remote the head's ingest from 4, 8, 16 collectors: CURVE over veth links vs loopback (root); ARGS=\"--out FILE\""
	@echo "make soak         the fault soak, SOAK_MINUTES (60) of injected failures"
	@echo "make soak-net     the multi-host fault soak (root: network namespaces), SOAK_NET_MINUTES (30) of network faults"
	@echo "make keys         CURVE keys for collectors on other machines: KEYS_DIR=keys [CLIENTS=\"m1 m2\"] (docs/clusters.md)"
	@echo "make install      the venv only (make run and make test do it themselves)"
	@echo "make record-golden        rewrite the Mario env's golden fixture (on purpose only)"
	@echo "make record-scale-chunks  rewrite the scale bench's recorded chunks (on purpose only)"
	@echo "make wheelhouse           wheels for a machine without a package registry (docs/GPU.md)"
	@echo "make wheelhouse-nes-py9   the nes-py 9 wheels for a machine that keeps its own Python 3.12 (docs/GPU.md)"
	@echo "make clean        remove the venvs, runs/bench and pytest's cache"
	@echo "make help         this list"

# pip, quiet: what it prints matters only when something fails. Dropped: pip's notes on find-links
# locations it skips, and setuptools' "Editable installation" notice (a UserWarning relayed from the
# build backend about folders named like the packages: here those folders are the packages).
PIP := PYTHONWARNINGS="ignore:Editable installation$(if $(PYTHONWARNINGS),$(comma)$(PYTHONWARNINGS))" $(VPY) -m pip
PIP_QUIET := 2>&1 | grep -v '^WARNING: Location' || true

# Re-install only when the requirements change: a no-op run costs a stat. The stem names the extras
# (dev-torch-ray installs ".[dev,torch,ray]"); each extra's module must import afterwards (Mario's
# package through the project's own import, which keeps old gym's banner off the terminal).
$(VENV)/.installed-%: setup.cfg pyproject.toml $(RETRO_REQUIREMENTS)
	@test -n "$(PY_TAG)" || { echo "error: PYTHON=$(PYTHON) is not a working Python interpreter" >&2; exit 2; }
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing mario-apex[$(subst -,$(comma),$*)] into $(VENV) (minutes the first time)"
	@$(PIP) install --quiet --upgrade "pip>=23" $(PIP_QUIET)
	@$(PIP) install --quiet -e ".[$(subst $(eval) ,$(comma),$(filter-out retro,$(subst -, ,$*)))]" $(PIP_QUIET)
	$(if $(filter retro,$(subst -, ,$*)),@$(PIP) install --quiet --no-deps -r $(RETRO_REQUIREMENTS) $(PIP_QUIET))
	@$(VPY) -c "from envs.mario.emulator import import_mario_package; import_mario_package(); \
		import shared, envs, replay, ingest, actors, learner, nes_py, zmq, cv2 \
		$(if $(filter torch,$(subst -, ,$*)),; import torch)$(if $(filter ray,$(subst -, ,$*)),; import ray)$(if $(filter retro,$(subst -, ,$*)),; import stable_retro)" \
		|| { echo "error: install incomplete in $(VENV)" >&2; exit 1; }
	@touch $@

# Everything CI runs: unit, property, real-emulator, multi-process and learning tests, spread over
# TEST_WORKERS processes (pytest-xdist), one test module per worker at a time: the suite's many runs of
# a head spend much of their time waiting on each other's processes, so 2 workers fill a 2-core
# machine. Every test owns its TMPDIR and ports (port 0), so tests running side by side cannot see
# each other's folders, sockets or processes. The few marked `alone` (judged by how processes share the
# CPU) run afterwards, one at a time. The research tools' tests (mark `experiments`) are left out:
# make test-experiments runs them. TEST_WORKERS=0 runs the suite in one process, in order. Status 5
# (nothing selected, e.g. PYTEST_ARGS naming a file without `alone` tests) is no failure.
TEST_WORKERS ?= 2
test: install
	$(VPY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not alone and not experiments" $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(VPY) -m pytest -m "alone and not experiments" $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The research tools' tests (experiments/: the tools that each fed one experiment record), in one process.
test-experiments: install
	$(VPY) -m pytest -m experiments $(PYTEST_ARGS)

# The suite in a random order (modules and the tests inside each shuffled; the seed is printed, and
# PYTEST_ARGS=--random-order-seed=N repeats an order): no test may depend on another having run first.
# Not the default: `make test` keeps each module's order (TEST_WORKERS=0 also the order of the modules).
test-random: install
	$(VPY) -m pytest --random-order $(PYTEST_ARGS)

# Inner loop: skip the slow mark.
test-fast: install
	$(VPY) -m pytest -m "not slow" $(PYTEST_ARGS)

# Environment tests only (no torch needed): used for the Python 3.13 emulator generation, which
# gets no torch here. Listed by file: collecting the other modules would import torch.
ENV_TESTS := tests/test_env_mario.py tests/test_env_factory.py tests/test_config.py tests/test_chunk.py tests/test_boundaries.py \
	tests/test_quiet.py
test-env: install
	$(VPY) -m pytest -m envonly $(ENV_TESTS) $(PYTEST_ARGS)

run: $(TRAIN_STAMP)
	$(VPY) -m launcher $(ARGS)

bench: $(TRAIN_STAMP)
	$(VPY) -m bench $(BENCH_ARGS)

# The head's ingest with remote collectors (tests/hostile/remote_ingest.py): bench/scale.py's synthetic collectors
# in network namespaces over veth links with CURVE, against loopback without it, for 4, 8 and 16 collectors;
# transitions/s, CPU per transition, transitions/s per head core. Needs root. ARGS: --collectors, --seconds, --out.
bench-remote: $(TRAIN_STAMP)
	$(VPY) -m tests.hostile.remote_ingest $(ARGS)

# Fault soak (tests/hostile/soak.py): a CartPole head for SOAK_MINUTES while collectors, peers, the disk and the head
# fail; exit 1 if anything acknowledged was lost or written twice, or a check failed. JSON report: SOAK_JSON.
SOAK_MINUTES ?= 60
SOAK_JSON ?= runs/soak.json
soak: $(TRAIN_STAMP)
	@mkdir -p $(dir $(SOAK_JSON))
	$(VPY) -m tests.hostile.soak --minutes $(SOAK_MINUTES) --json $(SOAK_JSON)

# Multi-host fault soak (tests/hostile/soak_net.py): a CURVE head and remote collectors on network-namespace hosts for
# SOAK_NET_MINUTES of partitions, latency, bandwidth caps, stalls, resets, head kills (resumed on the same port) and
# lost machines; exit 1 if an acknowledged chunk was lost or stored twice, or another invariant failed. Needs root.
SOAK_NET_MINUTES ?= 30
SOAK_NET_JSON ?= runs/soak-net.json
soak-net: $(TRAIN_STAMP)
	@mkdir -p $(dir $(SOAK_NET_JSON))
	$(VPY) -m tests.hostile.soak_net --minutes $(SOAK_NET_MINUTES) --json $(SOAK_NET_JSON)

eval: $(TRAIN_STAMP)
	@test -n "$(CHECKPOINT)" || { echo "usage: make eval CHECKPOINT=runs/<run>" >&2; exit 2; }
	$(VPY) -m evaluate $(CHECKPOINT) $(ARGS)

# Which levels checkpoints clear, across training seeds (evaluate/suite.py): one checkpoint per seed in CHECKPOINT,
# e.g. make suite CHECKPOINT="runs/a runs/b" ARGS="--levels 1-1,1-2,1-3,1-4 --out runs/suite"
suite: $(TRAIN_STAMP)
	@test -n "$(CHECKPOINT)" || { echo 'usage: make suite CHECKPOINT="runs/<run> ..." ARGS="--levels 1-1,1-2 --out DIR"' >&2; exit 2; }
	$(VPY) -m evaluate.suite $(CHECKPOINT) $(ARGS)

# A level campaign (evaluate/campaign.py): each level trains until its evaluations clear it or HOURS of training,
# then ships (docs/checkpoints, results/suite, the README's Levels table); the same command continues after a stop.
LEVELS ?=
HOURS ?= 4
.PHONY: levels
levels: $(TRAIN_STAMP)
	@test -n "$(LEVELS)" || { echo 'usage: make levels LEVELS="2-1 3-1 4-1" HOURS=4 [ARGS="--dir runs/campaign"]' >&2; exit 2; }
	$(VPY) -m evaluate.campaign --levels "$(LEVELS)" --hours $(HOURS) $(ARGS)

lint: install
	$(VPY) -m ruff check .

# CURVE keys for --curve-keys DIR. `make keys KEYS_DIR=keys`: the head's pair and one collector pair that
# every machine shares. `make keys KEYS_DIR=keys CLIENTS="m1 m2"`: one pair per collector machine (added to an
# existing DIR too; machine m1 gets keys/server.key and keys/clients/m1.key_secret and runs
# `python -m actors --curve-keys keys --curve-client m1 ...`); deleting keys/authorized_clients/m1.key
# refuses m1's next connection while the head runs.
keys: install
	$(VPY) -m shared.keys $(if $(KEYS_DIR),--dir $(KEYS_DIR),) $(if $(CLIENTS),--client $(CLIENTS),)

# Fixtures. tests/data/mario_golden.json pins the Mario env's rewards, infos and frames on both emulator
# generations: rewrite it on purpose only (ARGS=--check compares instead, exit 1 on a difference).
record-golden: install
	$(VPY) -m tests.record_mario_golden $(ARGS)

# bench/data/mario_1_1_chunks.npz: real Mario 1-1 chunks from a real Collector, replayed by bench/scale.py.
record-scale-chunks: $(TRAIN_STAMP)
	$(VPY) -m bench.record_scale_chunks $(ARGS)

# Wheels for a machine that reaches no package registry (docs/GPU.md), into $(WHEELHOUSE)/ (git-ignored).
# wheelhouse: everything `make install` and `make run` install for this interpreter (PYTHON=python3.X:
# the target machine's Python, on the same platform), plus pip and the build backend, so that there
# `PIP_NO_INDEX=1 PIP_FIND_LINKS=$$PWD/wheelhouse make install` works offline. Sdists (nes-py 8) are
# built here. WHEEL_ARGS reaches pip (e.g. another index for a CUDA build of torch).
WHEELHOUSE ?= wheelhouse
WHEEL_ARGS ?=
wheelhouse: install
	$(PIP) download --quiet --dest $(WHEELHOUSE) "pip>=23" "setuptools>=61" wheel $(WHEEL_ARGS) $(PIP_QUIET)
	$(PIP) wheel --quiet --wheel-dir $(WHEELHOUSE) ".[$(subst -,$(comma),$(call extras_tag,$(TORCH_EXTRA)))]" \
		$(WHEEL_ARGS) $(PIP_QUIET)
	rm -f $(WHEELHOUSE)/mario_apex-*.whl
	@ls $(WHEELHOUSE)

# wheelhouse-nes-py9: the emulator generation for a machine that keeps its own Python 3.12, torch and
# numpy 2 (no venv there, or its torch must stay). nes-py 8 breaks under numpy 2 and nes-py 9 publishes
# a cp313 wheel only; its sdist declares Python >= 3.13 but builds and runs on 3.12, so it is built here
# (PYTHON=python3.12) against NUMPY, the machine's numpy version. Beside it: gym-super-mario-bros 9.1.0
# (pure Python) and NES_PY9_WHEELS, requirements such a machine usually lacks (add what
# `python3 -c "import cv2, matplotlib, PIL"` finds missing there). Installed with --no-deps (docs/GPU.md).
NUMPY ?=
NES_PY9_WHEELS ?= pyzmq==27.3.0 gymnasium==1.4.0 farama-notifications==0.0.6 cloudpickle==3.1.3
wheelhouse-nes-py9:
	@test -n "$(PY_TAG)" || { echo "error: PYTHON=$(PYTHON) does not run (a pyenv shim of a version not selected? give the interpreter's path)" >&2; exit 2; }
	@test "$(PY_TAG)" = 312 || { echo "error: wheelhouse-nes-py9 builds for Python 3.12, and PYTHON=$(PYTHON) has the version tag $(PY_TAG)" >&2; exit 2; }
	@test -n "$(NUMPY)" || { echo "usage: make wheelhouse-nes-py9 PYTHON=python3.12 NUMPY=<the machine's numpy version>" >&2; exit 2; }
	@mkdir -p $(WHEELHOUSE)
	set -e; build=$$(mktemp -d); trap 'rm -rf "$$build"' EXIT; \
	$(PYTHON) -m venv "$$build/venv"; \
	"$$build/venv/bin/pip" install --quiet "cython>=3" "numpy==$(NUMPY)" setuptools wheel scikit-build-core cmake ninja; \
	"$$build/venv/bin/pip" download --quiet --no-deps --no-binary nes-py --no-build-isolation --python-version 3.13 \
		-d "$$build" nes-py==9.0.1; \
	tar xzf "$$build"/nes_py-9.0.1.tar.gz -C "$$build"; \
	sed -i 's/requires-python *= *">=3.13"/requires-python = ">=3.12"/' "$$build/nes_py-9.0.1/pyproject.toml"; \
	"$$build/venv/bin/pip" wheel --quiet --no-deps --no-build-isolation -w $(WHEELHOUSE) "$$build/nes_py-9.0.1"; \
	"$$build/venv/bin/pip" download --quiet --no-deps --only-binary=:all: -d $(WHEELHOUSE) $(NES_PY9_WHEELS); \
	"$$build/venv/bin/pip" download --quiet --no-deps --only-binary=:all: --python-version 3.13 -d $(WHEELHOUSE) \
		gym-super-mario-bros==9.1.0
	@ls $(WHEELHOUSE)

clean:
	rm -rf .venv .venv-py* runs/bench .pytest_cache
