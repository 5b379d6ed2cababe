# The two commands of README.md (and the one that regenerates docs/RESULTS.md).
.PHONY: demo test lint results images

# Set up (if needed) and run the main job on the built-in default.
demo:
	@scripts/setup.sh
	.venv/bin/rdtune demo

# Set up (if needed) and run the whole test suite, on every core (pytest-xdist; tests that
# must share one process, like the Ray ones, carry an xdist_group mark: --dist loadgroup).
test:
	@scripts/setup.sh
	.venv/bin/python -m pytest -n auto --dist loadgroup

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

# Run every evaluation suite (with the safe oracle) and regenerate docs/RESULTS.md.
results:
	@scripts/setup.sh
	.venv/bin/python -m eval.results

# The agent and tuner container images (deploy/docker/Dockerfile; deploy/kubernetes uses them).
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
images:
	docker build -f deploy/docker/Dockerfile --target agent -t rdtune-agent:$(VERSION) .
	docker build -f deploy/docker/Dockerfile --target tuner -t rdtune-tuner:$(VERSION) .
