# The two commands of the README. Each one sets up what it needs (idempotent) and then runs.
.PHONY: setup demo test bench

setup:
	bash infra/setup.sh

demo: setup
	.venv/bin/streamjoin demo

test: setup
	.venv/bin/python -m pytest -q --durations=25 tests

# Not a test: the benchmarks (about 30 minutes on 2 cores; bench/README.md). Writes bench/results/.
bench: setup
	.venv/bin/python -m bench.run
