"""Go's JSON decoding errors, as Nomad's agent passes them on for exec frames."""

from __future__ import annotations

import pytest

from controller.lab.simulator.gojson import GoJSONError, GoStruct, decode_struct, unmarshal_strings

IO = GoStruct("proto.ExecTaskStreamingIOOperation", {"data": "[]uint8", "close": "bool"})
SIZE = GoStruct("proto.TerminalSize", {"height": "int32"})
REQUEST = GoStruct("proto.ExecTaskStreamingRequest", {"stdin": IO, "tty_size": SIZE})


def test_decoding_fills_zero_values_matches_keys_loosely_and_reads_one_value() -> None:
    assert decode_struct('{"foo": 1}', REQUEST) == {"stdin": None, "tty_size": None}
    assert decode_struct('{"STDIN": {"Data": "aGk=", "close": null}} junk', REQUEST) == {
        "stdin": {"data": b"hi", "close": False},
        "tty_size": None,
    }
    with pytest.raises(EOFError):
        decode_struct(" \n", REQUEST)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("hello", "invalid character 'h' looking for beginning of value"),
        ("nope", "invalid character 'o' in literal null (expecting 'u')"),
        ('{"stdin":', "unexpected EOF"),
        ('{"a" 1}', "invalid character '1' after object key"),
        ('{"a":1 "b":2}', "invalid character '\"' after object key:value pair"),
        ('{"a":[1 2]}', "invalid character '2' after array element"),
        ("{'a':1}", "invalid character '\\'' looking for beginning of object key string"),
        ('{"a":"\\q"}', "invalid character 'q' in string escape code"),
        ("[]", "json: cannot unmarshal array into Go value of type proto.ExecTaskStreamingRequest"),
        (
            '{"stdin": 1}',
            "json: cannot unmarshal number into Go struct field "
            "ExecTaskStreamingRequest.stdin of type proto.ExecTaskStreamingIOOperation",
        ),
        (
            '{"stdin": {"close": "yes"}}',
            "json: cannot unmarshal string into Go struct field "
            "ExecTaskStreamingIOOperation.stdin.close of type bool",
        ),
        (
            '{"tty_size": {"height": 1.5}}',
            "json: cannot unmarshal number 1.5 into Go struct field "
            "TerminalSize.tty_size.height of type int32",
        ),
        ('{"stdin": {"data": "a!=="}}', "illegal base64 data at input byte 1"),
        ('{"stdin": {"data": "abcde"}}', "illegal base64 data at input byte 4"),
        ('{"stdin": {"data": "a==="}}', "illegal base64 data at input byte 1"),
    ],
)
def test_errors_read_as_go_writes_them(raw: str, message: str) -> None:
    with pytest.raises(GoJSONError) as refused:
        decode_struct(raw, REQUEST)
    assert refused.value.message == message


def test_unmarshal_strings_reads_the_whole_input() -> None:
    assert unmarshal_strings('["sh", null]') == ["sh", ""]
    assert unmarshal_strings("null") is None
    for raw, message in (
        ("", "unexpected end of JSON input"),
        ('["a"', "unexpected end of JSON input"),
        ('["a"] x', "invalid character 'x' after top-level value"),
        ("[1]", "json: cannot unmarshal number into Go value of type string"),
    ):
        with pytest.raises(GoJSONError) as refused:
            unmarshal_strings(raw)
        assert refused.value.message == message
