# `make demo` runs the bot on embedded defaults, `make test` runs the linters and every test
# (CI runs it: .ci/run), `make check` runs ruff and the unit tests (tests/unit) in seconds.
# Tests sit by cost: tests/unit (no database, no subprocess), tests/store (PostgreSQL and
# aiohttp in-process), tests/system (processes, fault drills, replayed mornings, the CPU vLLM).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
BENCH_STAMP := $(VENV)/.installed-bench
LLM ?= simulated
# Test workers (pytest-xdist): more than the cores, since the system tests mostly wait on
# processes, leases and the database; the vLLM tests and each line of fault drills keep to one
# worker (tests/conftest.py, tests/system/test_faults.py). TEST_WORKERS=0 runs them in-process.
TEST_WORKERS ?= 4

.PHONY: test check demo lint test-vllm bench bench-queue bench-queue-profile bench-intake bench-scheduling bench-llm bench-engine bench-review bench-forge clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check bot tests bench migrations
	$(BIN)/mypy
	$(BIN)/ruff format --check bot tests bench migrations
	$(BIN)/lint-imports

test: $(STAMP)
	$(BIN)/ruff check bot tests bench migrations
	$(BIN)/ruff format --check bot tests bench migrations
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

check: $(STAMP)
	$(BIN)/ruff check bot tests bench migrations
	$(BIN)/ruff format --check bot tests bench migrations
	$(BIN)/python -m pytest -q -n 2 tests/unit

test-vllm: $(STAMP)
	$(BIN)/python -m pytest -m vllm -v

demo: $(STAMP)
	$(BIN)/python -m bot demo --llm $(LLM) $(ARGS)

bench: bench-queue bench-intake bench-scheduling

bench-queue: $(BENCH_STAMP)
	$(BIN)/python bench/queue_throughput.py

# Where each queue of bench-queue waits inside PostgreSQL (pg_stat_activity), and the plans of
# review-bot's dequeue, finish and enqueue statements.
bench-queue-profile: $(BENCH_STAMP)
	$(BIN)/python bench/queue_profile.py

bench-intake: $(BENCH_STAMP)
	$(BIN)/python bench/intake.py

bench-scheduling: $(BENCH_STAMP)
	$(BIN)/python bench/scheduling.py

bench-llm: $(BENCH_STAMP)
	$(BIN)/python bench/llm_cpu.py

# The real CPU vLLM (scripts/vllm_cpu.sh): raw server against the whole bot, window 1 and adaptive.
bench-engine: $(BENCH_STAMP)
	$(BIN)/python bench/engine_throughput.py

# `bot eval` with the oracle before/after numbered lines and anchoring on three code bases, the
# reviews posted through the emulator, and SmolLM2-135M on the CPU vLLM (scripts/vllm_cpu.sh).
bench-review: $(BENCH_STAMP)
	$(BIN)/python bench/review_eval.py

# 1,000 reviews in one hour through one GitHub installation and one GitLab token of the
# emulator (its secondary limits on), in compressed time, through what `bot serve` runs.
bench-forge: $(BENCH_STAMP)
	$(BIN)/python bench/forge_budget.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache *.egg-info
