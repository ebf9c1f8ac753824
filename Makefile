# The two commands of the README. Each one sets up what it needs (idempotent) and then runs.
.PHONY: setup demo test check bench constraints

setup:
	bash infra/setup.sh

demo: setup
	.venv/bin/streamjoin demo

# Lint, format and type checks first (seconds), then the tests: two workers, one Spark session
# each, test files dealt out whole, slowest first (tests/conftest.py); the 25 slowest are printed.
test: setup check
	.venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25 tests

check: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

# Not a test: the benchmarks (about 30 minutes on 2 cores; bench/README.md). Writes bench/results/.
bench: setup
	.venv/bin/python -m bench.run

# After changing pyproject.toml's dependencies: install them without the pins (what is installed
# and still fits stays), then pin what is installed.
constraints:
	rm -f .venv/.streamjoin-installed
	STREAMJOIN_UNPINNED=1 bash infra/setup.sh
	(grep '^#' infra/constraints.txt; .venv/bin/python -m pip freeze --exclude-editable | grep -v '^uv==') \
		> infra/constraints.new && mv infra/constraints.new infra/constraints.txt
