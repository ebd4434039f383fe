# Two commands on a fresh machine: `make demo` and `make test`. Everything else is set-up they run.
PYTHON ?= python3
VENV ?= .venv
STAMP := $(VENV)/.installed-stamp

.PHONY: setup system-deps stack-up stack-down demo test

# torch is pinned in pyproject.toml to the CPU build on disk; pip never resolves an unpinned one.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	touch $@

setup: $(STAMP)

# Debian's Slurm, munge, slurmdbd and MariaDB (as root with apt; a no-op otherwise).
system-deps:
	bash deployments/stack/install-debian.sh

stack-up: setup system-deps
	$(VENV)/bin/pretrain stack up

stack-down: setup
	$(VENV)/bin/pretrain stack down

demo: setup
	$(VENV)/bin/pretrain demo

test: stack-up
	$(VENV)/bin/python -m pytest
