# pax-autockpt: `make demo` and `make test` are all a new user needs.
# paxml 1.4.0 pins TensorFlow 2.9 and jax 0.4.26, so everything runs on Python 3.10.

VENV   := .venv
PY     := $(VENV)/bin/python
PYTEST := $(PY) -m pytest
TENSORSTORE := 0.1.59

# The first interpreter that really runs 3.10: python3.10 on PATH, else pyenv's (or ~/.pyenv's) newest 3.10.
PYTHON310 ?= $(shell for p in "$$(command -v python3.10)" \
  $$(ls -d "$$(pyenv root 2>/dev/null || echo $$HOME/.pyenv)"/versions/3.10*/bin/python3.10 2>/dev/null | sort -rV); do \
  [ -n "$$p" ] && "$$p" -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null && { echo "$$p"; break; }; done)

.PHONY: venv lint test test-fast coverage demo bench bench-scale soak clean

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml Makefile
	@if [ -z "$(PYTHON310)" ]; then \
	  echo "error: Python 3.10 not found (paxml 1.4.0 needs it): install it (e.g. 'pyenv install 3.10' or 'apt-get install python3.10') or run 'make PYTHON310=/path/to/python3.10'" >&2; \
	  exit 1; fi
	test -x $(PY) || "$(PYTHON310)" -m venv $(VENV)
	@# uv installs what pip would (same versions) in ~30 s instead of ~85 s: parallel downloads, bytecode
	@# compiled in parallel. paxml 1.4.0 pins tensorstore 0.1.55, whose thread pool spins a CPU core for
	@# 20 s after each use (fixed in 0.1.59, see pax_autockpt.main.TENSORSTORE_FIXED): overridden.
	echo 'tensorstore==$(TENSORSTORE)' > $(VENV)/overrides.txt
	$(PY) -m pip install -q 'uv==0.13.9'
	$(VENV)/bin/uv pip install -q --python $(PY) --compile-bytecode --override $(VENV)/overrides.txt -e '.[test]'
	touch $@

# The 2-space Google style (ruff.toml), then the whole suite.
lint: venv
	$(VENV)/bin/ruff check pax_autockpt experiments tests rigs

test: venv lint
	$(PYTEST) -q -rs -n 2 --dist loadgroup --durations=25

# Branch coverage of pax_autockpt/ from the whole suite (`make test`'s pytest command), the real processes it
# starts included (.coveragerc; docs/development.md, "Coverage"). Not part of `make test`. A subset:
# `make coverage TESTS="tests/test_signals.py" COVERAGE_PYTEST="-q -n 0"`. The report is made even when a
# test failed; the exit status is pytest's then. HTML in build/coverage/html.
COVERAGE_PYTEST ?= -q -rs -n 2 --dist loadgroup --durations=25
# The whole suite's run loses some of pytest-xdist's workers' own data (tests/test_grace.py's asserted branches once
# read uncovered), so without TESTS the unit tests run again in one process (-n 0, ~4 min) and the data is joined.
coverage: venv
	rm -rf build/coverage
	$(VENV)/bin/coverage run -m pytest $(COVERAGE_PYTEST) $(TESTS); code=$$?; \
	  if [ -z "$(TESTS)" ]; then $(VENV)/bin/coverage run -m pytest -q -n 0 -m "not e2e and not soak and not bench" \
	    || code=$$?; fi; \
	  $(VENV)/bin/coverage combine -q && $(VENV)/bin/coverage report && $(VENV)/bin/coverage html -q || exit $$?; \
	  exit $$code

# Unit and registry tests only (no real training processes).
test-fast: venv
	$(PYTEST) -q -m "not e2e and not soak and not bench"

demo: venv
	$(VENV)/bin/pax-autockpt demo

# Long measurements on demand, never in CI.
# One scenario: `make bench ONLY=planscale` (names: `python -m rigs.bench --help`).
bench: venv
	$(PY) -m rigs.bench --out bench $(if $(ONLY),--only $(ONLY))

soak: venv
	$(PY) -m rigs.soak --cycles 30 --num_hosts 1
	$(PY) -m rigs.soak --cycles 10 --num_hosts 2 --seed 1
	$(PY) -m rigs.soak --scale 8
	$(PY) -m rigs.soak --cycles 30 --num_hosts 1 --gcs
	$(PY) -m rigs.soak --cycles 10 --num_hosts 2 --seed 1 --gcs
	@# Exact resume (a real input's position) on 1 host three ways, and on 2 hosts and gs://; 2 hosts from a
	@# 1-host checkpoint with a terminal's Ctrl-C; stock paxml main with a SIGTERM during the restore; 4 hosts in 2 slices; the local
	@# tier on 2 hosts (a replaced host filled by its replica, gs://; the Medium state's replica streamed) and
	@# 4 hosts in 2 slices; a storage outage at start-up on gs:// (TensorFlow's ~200 s of retries, then one
	@# line); the gs:// keep-latest chain and 2 hosts on one bucket; buddy copies end to end; a donor SIGKILLed
	@# mid-transfer; the adaptive interval and BestN over 2,000 steps; strangers flooding a live 2-host buddy
	@# job's peer server (its fixed port taken); the restore's choice against its reference model over 3,000
	@# generated histories, and the report's buckets against the truth of as many (AUTOCKPT_SOAK_HISTORIES=N for
	@# more); the fault walk over the writes of a SIGTERM and a Ctrl-C exit (stderr, stdout, the event log, the local
	@# tier; one host, and two under launch; every k up to 30, then a sample: AUTOCKPT_WALK_ALL=1 for every k); a
	@# SIGTERM while host 0 preserves after a commit, 2 hosts on gs:// (one exit plan for every host).
	$(PYTEST) -q -m soak tests/test_fault_walk.py tests/test_e2e_exact_resume.py tests/test_e2e_multihost.py tests/test_e2e_local_tier.py tests/test_e2e_gcs.py \
	  tests/test_e2e_policies.py tests/test_local_tier.py tests/test_soak.py tests/test_e2e_peer_flood.py \
	  tests/test_e2e_single_host.py tests/test_restore_model.py tests/test_report_histories.py tests/test_e2e_exit_plan.py
	@# Our policy decisions through the product against orbax-latest (0.12.8, its own Python 3.12 venv) on generated
	@# histories for AUTOCKPT_DIFFERENTIAL_MINUTES (5); a disagreement's case joins tests/data/orbax_differential_cases.json.
	tests/orbax_latest/make_venv.sh
	$(PYTEST) -q -s -m soak tests/test_policies_differential.py

# The save decision's protocol at 8 to 1,024 simulated hosts (no model; ~20 minutes).
bench-scale: venv
	$(PY) -m rigs.bench --only decision_scale --pairs 3 --out bench

clean:
	rm -rf $(VENV) *.egg-info demo_run
