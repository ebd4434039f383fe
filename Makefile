# Two commands on a fresh machine: `make demo` and `make test`. Everything else is set-up they run.
PYTHON ?= python3
VENV ?= .venv
STAMP := $(VENV)/.installed-stamp

.PHONY: setup system-deps node-deps stack-up stack-down demo test check

# mermaid and jsdom for the tests that parse and draw the loss chart with mermaid itself
# (tests/test_loss_curve.py), in a project-local node_modules. mermaid is the version the Prefect
# UI bundles (its `info` diagram in prefect/server/ui-v2/assets/vendor-mermaid-*.js reports it);
# jsdom the newest that supports Node 20.19. The stamp names both, so changing one reinstalls.
# pytest finds .cache/node by itself; MERMAID_NODE_MODULES (exported, overridable) says it too.
NODE_DIR := .cache/node
MERMAID_VERSION := 12.0.0
JSDOM_VERSION := 29.1.1
NODE_STAMP := $(NODE_DIR)/.installed-mermaid-$(MERMAID_VERSION)-jsdom-$(JSDOM_VERSION)
export MERMAID_NODE_MODULES ?= $(CURDIR)/$(NODE_DIR)/node_modules

# torch is pinned in pyproject.toml to the CPU build on disk; pip never resolves an unpinned one.
# uv installs the same set as pip (`uv pip freeze` and `pip freeze` agree) in 15 s instead of
# 2 min 20 s on the 2-core machine. uv does not read pip's configuration, so the package sources
# this machine gives pip (find-links, extra indexes, constraints) are handed to uv as they are,
# and every index is weighed alike, as pip weighs them (uv's default takes the first index that
# has a package).
#
# Bytecode is written as each module is first imported, Python's default, which this machine
# turns off (PYTHONDONTWRITEBYTECODE=1): without .pyc files every process would compile torch,
# transformers and Prefect afresh, 13 CPU-seconds to import them instead of 6.5, in each of the
# suite's hundreds of job and trainer processes. Compiling all of site-packages at install
# instead took 132 CPU-seconds for 25,000 files, of which the suite imports 9,000
# (docs/benchmarks.md).
export PYTHONDONTWRITEBYTECODE :=
UV_VERSION := 0.13.9
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet uv==$(UV_VERSION)
	pip_conf() { $(VENV)/bin/pip config get "global.$$1" 2>/dev/null || true; }; \
	  UV_FIND_LINKS="$$(pip_conf find-links)" UV_EXTRA_INDEX_URL="$$(pip_conf extra-index-url)" \
	  UV_CONSTRAINT="$$(pip_conf constraint)" UV_INDEX_STRATEGY=unsafe-best-match \
	  $(VENV)/bin/uv pip install --quiet --python $(VENV)/bin/python -e '.[test]'
	touch $@

setup: $(STAMP)

# Debian's Slurm, munge, slurmdbd and MariaDB, and Chromium for the UI screenshots (as root with
# apt; a no-op otherwise).
system-deps:
	bash deployments/stack/install-debian.sh

$(NODE_STAMP):
	@command -v node >/dev/null && command -v npm >/dev/null \
	  || { echo "node-deps: node and npm are needed (Node.js >= 20.19) to install mermaid for the tests"; exit 1; }
	npm install --prefix $(NODE_DIR) --save-exact --no-audit --no-fund --loglevel=error \
	  mermaid@$(MERMAID_VERSION) jsdom@$(JSDOM_VERSION)
	touch $@

node-deps: $(NODE_STAMP)

stack-up: setup system-deps
	$(VENV)/bin/pretrain stack up

stack-down: setup
	$(VENV)/bin/pretrain stack down

demo: setup
	$(VENV)/bin/pretrain demo

# Three workers beside one stack on two cores: much of the suite waits (on Slurm's scheduling,
# time limits and signals, on hang and lease timeouts, on Prefect), and a worker's waiting is
# the others' computing. Whole modules per worker, slowest first (their module fixtures are set
# up once). No test needs the machine to itself: one that judges time against the CPUs holds its
# processes to a CPU share or quota of their own (tests/slurm_faults.py).
#
# Before the workers start, two processes import what every worker, test server and job imports
# (the test modules, and Prefect's server), writing its bytecode once instead of in three workers
# and three servers at the same time; node-deps installs beside them, on the core they leave.
test: stack-up
	$(MAKE) --no-print-directory node-deps & node=$$!; \
	  $(VENV)/bin/python -c "import prefect.server.api.server" & \
	  $(VENV)/bin/python -m pytest --collect-only -q >/dev/null; \
	  wait $$node && wait
	$(VENV)/bin/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder

# The edit-test loop: the pure tests (pytest.mark.pure), with no stack and no Prefect server, on
# two workers: they compute (converter, tokenizer, trainer subprocesses) and use both cores.
check: setup
	$(VENV)/bin/python -m pytest -m pure -n 2
