"""LC latency from a Prometheus histogram a service already exports.

Configured per group (URL + metric name). Each observation interval the agent scrapes the
service's text exposition, sums the histogram's cumulative ``_bucket{le=...}`` series over
all label sets, and turns the change since the previous scrape into per-bucket counts for
:meth:`agent.latency.LatencyRecorder.add_histogram`. The first scrape only sets the
baseline; a counter reset (a restarted service) starts a new baseline from zero.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import logging
import math
import socket
import threading
from dataclasses import dataclass
from urllib.parse import urlparse

from prometheus_client.parser import text_string_to_metric_families

from agent.latency import LatencyRecorder

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 << 20


@dataclass(frozen=True)
class ScrapeTarget:
    """Where one group's latency histogram lives.

    Attributes:
        url: the service's metrics endpoint (http or https).
        metric: the histogram's name, without ``_bucket``.
        scale_to_ms: factor turning the histogram's unit into milliseconds (default: 1000
            for a name ending in ``_seconds``, else 1).
    """

    url: str
    metric: str
    scale_to_ms: float | None = None

    def __post_init__(self) -> None:
        if urlparse(self.url).scheme not in ("http", "https"):
            raise ValueError(f"scrape URL {self.url!r} must be http:// or https://")
        if not self.metric:
            raise ValueError("scrape target needs a metric name")

    @property
    def scale(self) -> float:
        if self.scale_to_ms is not None:
            return self.scale_to_ms
        return 1000.0 if self.metric.endswith("_seconds") else 1.0


def parse_histogram(text: str, metric: str) -> dict[float, float]:
    """Cumulative bucket counts by upper bound, summed over every label set."""
    base = metric.removesuffix("_bucket")
    out: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != base:
            continue
        for sample in family.samples:
            if sample.name != base + "_bucket":
                continue
            bound = float(sample.labels["le"])
            out[bound] = out.get(bound, 0.0) + float(sample.value)
    return out


class HistogramScraper:
    """Scrapes one group's histogram and feeds the deltas into a recorder."""

    def __init__(
        self, group: str, target: ScrapeTarget, recorder: LatencyRecorder, timeout_s: float = 0.5
    ) -> None:
        self.group, self.target, self.recorder, self.timeout_s = group, target, recorder, timeout_s
        self._previous: dict[float, float] | None = None

    def fetch(self) -> str:
        """The exposition's text, fetched whole within ``timeout_s``.

        A socket timeout bounds each read, not the fetch: an exporter that sends a byte
        every few tenths of a second would hold the Observe that scrapes it (and the
        agent's exit, which waits for it) for as long as it keeps sending. A watchdog
        shuts the connection's socket at the deadline, which ends any read under way."""
        url = urlparse(self.target.url)
        https = url.scheme == "https"
        conn_class = http.client.HTTPSConnection if https else http.client.HTTPConnection
        conn = conn_class(url.hostname, url.port, timeout=self.timeout_s)
        expired = threading.Event()
        opened: list[socket.socket] = []  # the connection hands its socket to the response

        def expire() -> None:
            expired.set()
            for sock in opened:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        watchdog = threading.Timer(self.timeout_s, expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.connect()
            opened.append(conn.sock)  # the watchdog's from now on
            if expired.is_set():
                raise TimeoutError(self._late())
            path = (url.path or "/") + (f"?{url.query}" if url.query else "")
            conn.request("GET", path, headers={"Accept": "text/plain"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise ValueError(f"{self.target.url} answered HTTP {resp.status} {resp.reason}")
            body = resp.read(MAX_BODY_BYTES)
        except (OSError, http.client.HTTPException) as exc:
            if expired.is_set():
                raise TimeoutError(self._late()) from exc
            raise
        finally:
            watchdog.cancel()
            conn.close()
        if expired.is_set():  # the shutdown can end a body read as if it were complete
            raise TimeoutError(self._late())
        return body.decode("utf-8", "replace")

    def _late(self) -> str:
        return f"{self.target.url} did not send its metrics within {self.timeout_s:g} s"

    def scrape_once(self, text: str | None = None) -> int:
        """Scrape (or parse ``text``), feed the delta; return the requests it covered."""
        current = parse_histogram(self.fetch() if text is None else text, self.target.metric)
        if not current:
            raise ValueError(f"no histogram {self.target.metric!r} at {self.target.url}")
        previous, self._previous = self._previous, current
        if previous is None or set(previous) != set(current):
            return 0  # baseline (first scrape, or the buckets changed)
        bounds = sorted(current)
        delta = [current[b] - previous[b] for b in bounds]
        if any(d < 0 for d in delta):
            return 0  # counter reset: this scrape is the new baseline
        counts = [delta[0]] + [max(0.0, b - a) for a, b in itertools.pairwise(delta)]
        total = sum(counts)
        if total <= 0:
            return 0
        scaled = [b * self.target.scale if math.isfinite(b) else b for b in bounds]
        self.recorder.add_histogram(self.group, scaled, counts)
        return round(total)
