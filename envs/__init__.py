"""Gymnasium environments over any Node: rewards, wrappers (registered on import)."""
