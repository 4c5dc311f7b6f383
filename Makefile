# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# The first Python >= 3.11 on PATH; `make PYTHON=/path/to/python3.x` chooses another.
PYTHON ?= $(shell for p in python3.11 python3.12 python3.13 python3.14 python3; do \
	  command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
	  2>/dev/null && { command -v $$p; break; }; done)
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

.PHONY: venv demo demo-fleet test test-fast lint bench openapi clean

venv: $(STAMP)

# torch==2.13.0 is installed first so that the `train` extra's range (torch>=2.3)
# is already satisfied, and every install runs under constraints-torch.txt so that no
# dependency (transformers, lightning, ...) can upgrade it to a multi-GB CUDA build.
$(STAMP): pyproject.toml constraints-torch.txt
	@test -n "$(PYTHON)" || { echo "make: no Python >= 3.11 on PATH; install one or give PYTHON=/path/to/python3.x" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints-torch.txt torch numpy
	$(PIP) install -q -c constraints-torch.txt -e '.[train,dev,postgres]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# Issue #17: a lost node, its BMC (a real Redfish emulator) asked, a power cycle
# approved and verified, the node validated and returned to service.
demo-fleet: $(STAMP)
	$(PY) examples/demo_fleet.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/ruff format --check src tests bench examples
	$(VENV)/bin/mypy

# The tests start their own real services (PostgreSQL, a local Slurm cluster) through
# scripts/*-local.sh fixtures; the browser test needs Debian's chromium, the alerting
# tests Debian's prometheus (scripts/prometheus-local.sh).
test: lint
	scripts/install-chromium.sh
	scripts/prometheus-local.sh >/dev/null
	$(VENV)/bin/pytest -q -n 4 --dist loadgroup

test-fast: $(STAMP)
	$(VENV)/bin/pytest -q -n 4 --dist loadgroup -m "not slow"

bench: $(STAMP)
	$(PY) bench/run_all.py

openapi: $(STAMP)
	$(PY) scripts/gen-openapi.py
	$(PY) scripts/gen-policy-docs.py

clean:
	rm -rf $(VENV) .trainguard build *.egg-info
