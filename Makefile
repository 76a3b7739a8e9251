# Any python >= 3.11: the first of these that is one, unless PY=... names it.
PY ?= $(firstword $(foreach p,python3 python3.11 python3.12 python3.13,$(shell $(p) -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 && echo $(p))))
# VENV=.venv-py313 PY=python3.13: a second venv for another Python (CI's Python 3.13 leg).
VENV ?= .venv
BIN := $(VENV)/bin
NATIVE := $(wildcard ray_tfrecord/_src/core/native/*.[ch])

.PHONY: demo test test-slow test-all lint bench docs clean test-lowest clean-lowest

$(BIN)/python:
	@test -n "$(PY)" || { echo "make: no python >= 3.11 found; install one or name it: make PY=/path/to/python3.12" >&2; exit 1; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# One stamp per extra: the demo installs only what it needs (.[demo]); the tests add the rest (.[dev]);
# the benchmark adds matplotlib for its chart (.[bench]).
$(VENV)/.installed-%: pyproject.toml setup.py $(NATIVE) | $(BIN)/python
	$(BIN)/pip install -q -e '.[$*]'
	touch $@

demo: $(VENV)/.installed-demo
	$(BIN)/python train_examples/digits.py

# Two tiers, chosen by what a test costs (tests/README.md): `make test` runs every module's tests of our own
# logic, the fast tier (-m "not slow"); `make test-slow` the expensive end-to-end runs (Ray Train groups,
# killed and restarted jobs, Ray clusters, docs pages, servers); `make test-all` both. CI runs both.
test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -m "not slow"

test-slow: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -m slow

test-all: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q

# ruff and mypy over the package (configured in pyproject.toml): zero findings, or CI fails.
lint: $(VENV)/.installed-dev
	$(BIN)/ruff check ray_tfrecord
	$(BIN)/mypy

bench: $(VENV)/.installed-bench
	$(BIN)/python -m bench

# The docs site (mkdocs.yml, docs/) into site/: strict, so a warning (a broken link or anchor, a page
# missing from the nav or from docs/) fails the build. Its code examples run in `make test`.
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The lowest supported versions (.ci/lowest-constraints.txt: Ray 2.50, pyarrow 18, numpy 2.0, TF 2.18) in a
# second venv, and the Ray- and TF-facing tests under them, so both ends of the Ray range run the same tests. The editable install rebuilds ray_tfrecord/_src/core/_native*.so in place; with
# the same python3.11 that is the same file .venv builds. The pins go in with -r, not -c: as
# constraints, pip 26 backtracks for many minutes through opentelemetry releases before settling.
# TensorFlow 2.18, the lowest, has wheels for python 3.9-3.12 only.
LOWEST_PY ?= $(firstword $(foreach p,python3.11 python3.12,$(shell command -v $(p))))
LOWEST_VENV := .venv-lowest
LOWEST_BIN := $(LOWEST_VENV)/bin
LOWEST_STAMP := $(LOWEST_VENV)/.installed
LOWEST_CONSTRAINTS := .ci/lowest-constraints.txt
LOWEST_TESTS := tests/test_versions.py tests/test_codec.py tests/test_framing.py tests/test_schema.py \
	tests/test_datasource.py tests/test_datasink.py tests/test_faults.py tests/test_index.py \
	tests/test_planning.py tests/test_partitioning.py tests/test_user_errors.py tests/test_s3.py \
	tests/test_cli.py tests/test_feed.py tests/test_inference.py tests/test_train.py \
	tests/test_decimals.py tests/test_globs.py tests/test_decoder.py tests/test_encoder.py tests/test_commit.py tests/test_contract.py \
	tests/test_other_writers.py tests/test_keras3.py tests/test_checkpoint_jobs.py tests/test_elastic.py \
	tests/test_tf_import.py tests/test_plan_scale.py tests/test_inference_resume.py tests/test_feature_specs.py \
	tests/test_serialized_tensors.py tests/test_tf_filesystems.py tests/test_write_options.py tests/test_random_access.py \
	tests/test_num_files.py tests/test_feed_numpy.py

# In two steps: the floors and the tests' requirements (.ci/requirements.py lists them from
# pyproject.toml), which touch nothing in the tree, so CI installs them while make test runs; then
# the package itself, editable, without dependencies.
LOWEST_DEPS := $(LOWEST_VENV)/.installed-deps
$(LOWEST_DEPS): pyproject.toml .ci/requirements.py $(LOWEST_CONSTRAINTS)
	test -x $(LOWEST_BIN)/python || $(LOWEST_PY) -m venv $(LOWEST_VENV)
	$(LOWEST_BIN)/pip install -q --upgrade pip
	$(LOWEST_BIN)/python .ci/requirements.py test > $(LOWEST_VENV)/requirements.txt
	$(LOWEST_BIN)/pip install -q -r $(LOWEST_CONSTRAINTS) -r $(LOWEST_VENV)/requirements.txt
	touch $@

$(LOWEST_STAMP): $(LOWEST_DEPS) setup.py $(NATIVE)
	$(LOWEST_BIN)/pip install -q --no-deps -e .
	touch $@

# Tests of our own logic that run Ray Train as any release does (one Ray Train run each, a minute or
# two on 2 cores), and the second save mode of a killed driver (the kill is Ray's, the mode ours). The
# floor still runs Ray Train groups where releases differ: a Keras 3 custom loop through checkpoints
# and inference (test_keras3), and a worker whose Keras is not the one asked for. Also left to the
# newest release: inference's two output formats (the floor runs the datasink's own tests and every
# model format's predictions) and a quoted glob through the CLI (globs are ours; the CLI's Ray runs
# are in test_cli and test_user_errors).
LOWEST_SKIP := tests/test_train.py::test_three_workers_take_equal_steps_and_per_replica_batches_read_each_row_once \
	tests/test_train.py::test_killed_worker_resumes_from_checkpoint \
	tests/test_faults.py::test_killed_driver_leaves_old_dataset_and_retry_succeeds[error] \
	tests/test_inference.py::test_inference_writes_one_row_per_input \
	tests/test_globs.py::test_cli_takes_a_quoted_glob

# Ray 2.50 has Train v2 (which tf/train.py's worker_runtime_env needs) behind this switch; 2.51+ default to it.
test-lowest: $(LOWEST_STAMP)
	RAY_TRAIN_V2_ENABLED=1 $(LOWEST_BIN)/python -m pytest -q $(LOWEST_TESTS) $(foreach t,$(LOWEST_SKIP),--deselect '$(t)')

clean-lowest:
	rm -rf $(LOWEST_VENV)

include fuzz.mk

clean:
	rm -rf $(VENV) build site *.egg-info ray_tfrecord/_src/core/*.so
