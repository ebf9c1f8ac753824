# The two commands of the README. Each one sets up what it needs (idempotent) and then runs.
.PHONY: setup demo test

setup:
	bash infra/setup.sh

demo: setup
	.venv/bin/streamjoin demo

test: setup
	.venv/bin/python -m pytest -q tests
