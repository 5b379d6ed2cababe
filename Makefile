# The two commands of README.md (and the one that regenerates docs/RESULTS.md).
.PHONY: demo test lint results

# Set up (if needed) and run the main job on the built-in default.
demo:
	@scripts/setup.sh
	.venv/bin/rdtune demo

# Set up (if needed) and run the whole test suite.
test:
	@scripts/setup.sh
	.venv/bin/python -m pytest

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

# Run every evaluation suite (with the safe oracle) and regenerate docs/RESULTS.md.
results:
	@scripts/setup.sh
	.venv/bin/python -m eval.results
