"""Simulated CAT/MBA server (SimNode): workloads, machine presets, scenarios."""
