"""What every rdtune configuration file shares: the one error a refused setting raises.

The agent's, the tuner's, the training and the suite files all raise :class:`ConfigError`
for a setting they refuse, saying which setting and why (docs/DEPLOY.md).
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration rdtune refuses to run with; the message says what is wrong."""
