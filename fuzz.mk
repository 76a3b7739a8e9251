# Fuzzing of the native codec (included from the Makefile; also works alone: make -f fuzz.mk ...).
#   make fuzz          build the sanitized targets and run each for FUZZ_SECONDS (default 60)
#   make fuzz-smoke    CI: FUZZ_SMOKE_SECONDS (default 5) per target; installs clang when missing and
#                      root, else falls back to gcc; fails only for a finding, never for a missing tool
#   make fuzz-cov      llvm-cov line coverage of the native units over the seeds and the inputs kept by `make fuzz`
#   make fuzz-corpus   regenerate the seed corpora in fuzz/corpus/ (needs the package importable)
# FUZZ_TARGETS picks targets (default: scan decode_example decode_sequence inspect encode pool tensor jpeg;
# jpeg only where libjpeg-turbo's headers are installed).
_FUZZ_DEFAULT_GOAL := $(.DEFAULT_GOAL)
FUZZ_SECONDS ?= 60
FUZZ_SMOKE_SECONDS ?= 5
FUZZ_TARGETS ?= scan decode_example decode_sequence inspect encode pool tensor jpeg
FUZZ_PYTHON ?= $(firstword $(wildcard .venv/bin/python) $(shell command -v python3.11 || command -v python3))
FUZZ_ENV = FUZZ_TARGETS="$(FUZZ_TARGETS)" FUZZ_PYTHON="$(FUZZ_PYTHON)"

.PHONY: fuzz fuzz-smoke fuzz-cov fuzz-corpus

fuzz:
	$(FUZZ_ENV) FUZZ_SECONDS=$(FUZZ_SECONDS) bash fuzz/run.sh fuzz

fuzz-smoke:
	$(FUZZ_ENV) FUZZ_SECONDS=$(FUZZ_SMOKE_SECONDS) bash fuzz/run.sh smoke

fuzz-cov:
	$(FUZZ_ENV) bash fuzz/run.sh cov

fuzz-corpus:
	PYTHONPATH=. $(FUZZ_PYTHON) fuzz/make_corpus.py

# Including this file never changes the includer's default goal.
.DEFAULT_GOAL := $(_FUZZ_DEFAULT_GOAL)
