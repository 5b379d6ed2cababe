"""The online tuner: control loop, safety guard, metrics, and the rdtune CLI."""
