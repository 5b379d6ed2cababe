"""Evaluation: suites, head-to-head comparisons, reports, benchmarks."""
