"""Log lines as text and as JSON: the fields, kopf's object lines, exceptions."""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path

import pytest
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong

from controller.core.events import breaker_opened
from controller.logs import JsonFormatter, MalformedRequests, TextFormatter
from controller.service import log_event

RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def record(
    message: str = "hello %s",
    *args: object,
    level: int = logging.INFO,
    name: str = "controller.test",
    **extra: object,
) -> logging.LogRecord:
    made = logging.LogRecord(name, level, __file__, 1, message, args or ("world",), None)
    made.__dict__.update(extra)
    return made


def test_a_json_line_has_time_level_logger_message_and_the_extra_fields() -> None:
    line = JsonFormatter().format(record(pool="default/py", reason="CircuitBreakerOpen"))
    entry = json.loads(line)
    assert RFC3339_UTC.fullmatch(entry.pop("time"))
    assert entry == {
        "level": "INFO",
        "logger": "controller.test",
        "message": "hello world",
        "pool": "default/py",
        "reason": "CircuitBreakerOpen",
    }


def test_a_domain_event_carries_its_pool_and_reason(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="controller.service"):
        log_event(breaker_opened("default/py", 3, 2.0, "Driver Failure: no such image"))
    (logged,) = caplog.records
    entry = json.loads(JsonFormatter().format(logged))
    assert (entry["level"], entry["pool"], entry["reason"]) == (
        "WARNING",
        "default/py",
        "CircuitBreakerOpen",
    )
    assert entry["message"] == (
        "pool default/py: CircuitBreakerOpen: runner creation paused for 2 s after 3 failed "
        "starts in a row; last: Driver Failure: no such image"
    )


def test_kopf_object_lines_name_the_object_and_hide_kopf_internals() -> None:
    kopf_line = record(
        "Handler 'observe' succeeded.",
        name="kopf.objects",
        k8s_ref={"kind": "RunnerPool", "namespace": "team-a", "name": "py"},
        k8s_skip=True,
        settings=object(),
    )
    kopf_line.args = None
    entry = json.loads(JsonFormatter().format(kopf_line))
    assert entry["object"] == "team-a/py"
    assert entry["message"] == "Handler 'observe' succeeded."
    assert not {"k8s_ref", "k8s_skip", "settings"} & set(entry)
    text = TextFormatter().format(kopf_line)
    assert text.endswith(" INFO kopf.objects: [team-a/py] Handler 'observe' succeeded.")
    assert kopf_line.msg == "Handler 'observe' succeeded."  # other handlers see it unchanged


def test_an_exception_stays_on_one_json_line() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        failed = record("pass crashed", level=logging.ERROR, exc_info=sys.exc_info())
    failed.args = None
    line = JsonFormatter().format(failed)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["level"] == "ERROR"
    assert "RuntimeError: boom" in entry["exception"]


def test_values_json_cannot_carry_are_written_as_text() -> None:
    entry = json.loads(JsonFormatter().format(record(path=Path("/x"))))
    assert entry["path"] == "/x"


def test_the_text_format_is_time_level_logger_and_message() -> None:
    text = TextFormatter().format(record(pool="default/py"))
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO controller.test: hello world", text
    ), text


def _refusal(error: BaseException) -> logging.LogRecord:
    """A record as aiohttp's server writes it for a request it could not handle."""
    return logging.LogRecord(
        "controller.http", logging.ERROR, __file__, 1, "Error handling request from %s",
        ("10.0.0.7",), (type(error), error, None),
    )  # fmt: skip


def test_malformed_requests_are_one_line_a_second_without_a_traceback() -> None:
    now = [100.0]
    quiet = MalformedRequests(interval=1.0, clock=lambda: now[0])
    first = _refusal(LineTooLong("Header value is too long", "8190", "20000"))
    assert quiet.filter(first)
    assert (first.levelno, first.levelname, first.exc_info) == (logging.INFO, "INFO", None)
    assert first.getMessage().startswith("refused a malformed request from 10.0.0.7: 400 ")
    assert not quiet.filter(_refusal(BadHttpMessage("bad")))
    assert not quiet.filter(_refusal(BadHttpMessage("bad")))
    now[0] += 1.0
    third = _refusal(BadHttpMessage("Invalid header"))
    assert quiet.filter(third)
    assert third.getMessage().endswith("(2 more since the last line)")
    # A failure of poolkeeper's own is no client's fault: it stays as it is.
    own = _refusal(RuntimeError("a bug"))
    assert quiet.filter(own) and own.levelno == logging.ERROR and own.exc_info is not None
