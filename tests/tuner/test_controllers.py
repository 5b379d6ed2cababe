"""Choosing the controller and the fallback; JSON log lines."""

from __future__ import annotations

import json
import logging

import pytest

from agent.sim import SimNode
from models import catalogue
from tuner.controllers import ControllerError, build, check, fallback
from tuner.logs import JsonFormatter

NODE = SimNode("default")


def test_catalogue_and_imported_controllers() -> None:
    assert build("eq", NODE).name == "eq"
    assert build("ucp[period=5]", NODE).period == 5
    assert build("import:tests.tuner.controllers:Quiet", NODE).name == "quiet"


@pytest.mark.parametrize(
    ("spec", "options", "message"),
    [
        ("nope", {}, "unknown controller 'nope'"),
        ("import:tests.tuner.controllers", {}, "use import:MODULE:CLASS"),
        ("import:tests.tuner.nothing:X", {}, "No module named"),
        ("import:tests.tuner.controllers:Nothing", {}, "has no attribute 'Nothing'"),
        ("import:json:JSONDecoder", {}, "is not a models.controller.Controller"),
        ("eq", {"colour": "red"}, "bad options for controller 'eq'"),
        ("policy:", {}, "policy: needs a path"),
    ],
)
def test_bad_controller_specs_say_why(spec: str, options: dict, message: str) -> None:
    with pytest.raises(ControllerError) as err:
        build(spec, NODE, options)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "name", [name for name, entry in catalogue.CATALOGUE.items() if entry.prepare is not None]
)
def test_a_calibrating_controllers_option_names_are_checked_at_start(name: str) -> None:
    """Its prepare step's options count, and nothing else: a typo in one is refused before
    the tuner waits for its agent, listing what the controller takes."""
    takes = catalogue.get(name).takes()
    assert takes is not None
    if name == "policy":  # loaded at the check, so its options must be valid values too
        options = {"compiled": False, "threads": 1, "decide_s": 1.0}
        assert set(options) == takes - {"path"}  # the path names the export
        check(name, options)
    else:
        check(name, {key: None for key in takes})
    with pytest.raises(ControllerError) as err:
        check(name, {"colour": "red"})
    assert str(err.value).startswith(
        f"controller {name!r}: unknown option(s) colour; it takes {', '.join(sorted(takes))}"
    )


def test_static_takes_its_sweep_settings() -> None:
    check("static[measure_s=1]", {"warmup_s": 0.1})
    with pytest.raises(ControllerError, match=r"unknown option\(s\) measure; it takes .*measure_s"):
        check("static[measure=1]")


def test_fallback_defaults_and_choices() -> None:
    default = fallback()
    # static needs its sweep's options, so the default is Ubik strict
    assert default.name == "ubik" and default.slack == 0.0
    assert fallback("eq").name == "eq"
    for policy in ("policy:/some/export", "policy"):
        with pytest.raises(ControllerError, match="not a learned policy"):
            fallback(policy)
    static = fallback("static", {"lc_group": "memcached", "ways": 4})
    assert (static.name, static.ways) == ("static", 4)


def test_json_log_lines_carry_the_event_fields() -> None:
    record = logging.LogRecord(
        "rdtune.tuner", logging.WARNING, __file__, 1, "switch %s", ("x",), None
    )
    record.event, record.tripped_by = "switch", ["web"]
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "switch x" and line["level"] == "warning"
    assert line["event"] == "switch" and line["tripped_by"] == ["web"]
    assert line["logger"] == "rdtune.tuner" and line["ts"].endswith("+00:00")
