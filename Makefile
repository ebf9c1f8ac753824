# The two commands of the README. Each one sets up what it needs (idempotent) and then runs.
.PHONY: setup packages bytecode class-archive demo test check lint lint-then-bytecode bench constraints

setup:
	bash infra/setup.sh

# Set-up without the driver class archive and the installed modules' bytecode (all the checks
# need), then each of those alone. `make test` makes the archive (a JVM for about a minute, using
# one of the two cores) while the checks (25 s) and then the bytecode (30 s on one core) run on
# the other: set-up and checks about 74 s instead of 79 s, one after the other (docs/testing.md).
packages:
	STREAMJOIN_NO_CLASS_ARCHIVE=1 STREAMJOIN_NO_BYTECODE=1 bash infra/setup.sh

# Its recipe is set-up itself (without the archive), which installs what is missing first.
bytecode:
	STREAMJOIN_NO_CLASS_ARCHIVE=1 bash infra/setup.sh

class-archive: packages
	.venv/bin/streamjoin setup-jars --dir "$(CURDIR)/.jars" >/dev/null

demo: setup
	.venv/bin/streamjoin demo

# Lint, format, type and shape checks first (beside the class archive and the bytecode), then the tests:
# two workers, one Spark session each, test files dealt out whole, slowest first
# (tests/conftest.py); the 25 slowest are printed.
test: packages
	$(MAKE) --no-print-directory -j2 class-archive lint-then-bytecode
	.venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25 tests

check: packages
	$(MAKE) --no-print-directory lint

lint-then-bytecode: packages
	$(MAKE) --no-print-directory lint
	STREAMJOIN_BYTECODE_JOBS=1 $(MAKE) --no-print-directory bytecode

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	.venv/bin/python infra/shape.py

# Not a test: the benchmarks (about 30 minutes on 2 cores; bench/README.md). Writes bench/results/.
bench: setup
	.venv/bin/python -m bench.run
	.venv/bin/python -m bench.slices --hours 24
	.venv/bin/python -m bench.slices --hours 720 --bids-per-hour 100 --commit-hours 24 --grace 2d --batch 720
	.venv/bin/python -m bench.run --report-only

# After changing pyproject.toml's dependencies: install them without the pins (what is installed
# and still fits stays), then pin what is installed.
constraints:
	rm -f .venv/.streamjoin-installed
	STREAMJOIN_UNPINNED=1 bash infra/setup.sh
	(grep '^#' infra/constraints.txt; .venv/bin/uv pip freeze --python .venv/bin/python --exclude-editable \
		| grep -Ev '^(uv|pip|setuptools)==') \
		> infra/constraints.new && mv infra/constraints.new infra/constraints.txt
