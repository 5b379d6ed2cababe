"""Value types for the ``rdtune`` command line: numbers that must be positive or not
negative, and URLs that must be web addresses, refused by argparse with a message naming
the option (``--seconds -3``) before the command does anything."""

from __future__ import annotations

import argparse
import math

from agent.types import MAX_WAIT_S


def _number(kind: type, text: str) -> float | int:
    try:
        value = kind(text)
    except ValueError:
        noun = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds, intervals, durations)."""
    value = _number(float, text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def wait_seconds(text: str) -> float:
    """Seconds > 0 and at most an hour (``MAX_WAIT_S``): an interval the agent waits out,
    or a deadline of one call to it."""
    value = positive_float(text)
    if value > MAX_WAIT_S:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_WAIT_S:g} s, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    value = _number(float, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def positive_int(text: str) -> int:
    """A whole number >= 1 (counts: seeds, intervals, steps)."""
    value = _number(int, text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """A whole number >= 0 (random seeds: numpy refuses a negative one, which would
    otherwise surface only once a run is under way)."""
    value = _number(int, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def http_url(text: str) -> str:
    """An http:// or https:// URL naming a host (urllib would read a file: URL as well,
    and a bare word would be found wrong only once everything else had been done)."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an http:// or https:// URL with a host "
            "(e.g. http://127.0.0.1:9465/metrics)"
        )
    return text
