PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean test-lowest clean-lowest

$(STAMP): pyproject.toml setup.py $(wildcard ray_tfrecord/native/*.[ch])
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python train_examples/digits.py

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m bench

# The lowest supported versions (.ci/lowest-constraints.txt) in a second venv, and the Ray- and
# TF-facing tests under them. The editable install rebuilds ray_tfrecord/_native*.so in place; with
# the same python3.11 that is the same file .venv builds. The pins go in with -r, not -c: as
# constraints, pip 26 backtracks for many minutes through opentelemetry releases before settling.
LOWEST_VENV := .venv-lowest
LOWEST_BIN := $(LOWEST_VENV)/bin
LOWEST_STAMP := $(LOWEST_VENV)/.installed
LOWEST_CONSTRAINTS := .ci/lowest-constraints.txt
LOWEST_TESTS := tests/test_versions.py tests/test_codec.py tests/test_framing.py tests/test_schema.py \
	tests/test_datasource.py tests/test_datasink.py tests/test_faults.py tests/test_index.py \
	tests/test_cli.py tests/test_feed.py tests/test_inference.py tests/test_train.py

$(LOWEST_STAMP): pyproject.toml setup.py $(wildcard ray_tfrecord/native/*.[ch]) $(LOWEST_CONSTRAINTS)
	test -x $(LOWEST_BIN)/python || $(PY) -m venv $(LOWEST_VENV)
	$(LOWEST_BIN)/pip install -q --upgrade pip
	$(LOWEST_BIN)/pip install -q -r $(LOWEST_CONSTRAINTS) -e '.[test]'
	touch $(LOWEST_STAMP)

test-lowest: $(LOWEST_STAMP)
	$(LOWEST_BIN)/python -m pytest -q $(LOWEST_TESTS)

clean-lowest:
	rm -rf $(LOWEST_VENV)

include fuzz.mk

clean:
	rm -rf $(VENV) build *.egg-info ray_tfrecord/*.so
