"""Go's JSON decoding and strconv errors, as Nomad's agent and Poseidon pass them on."""

from __future__ import annotations

import base64
import json

import jsonschema
import pytest

from controller.core.gojson import (
    GoJSONError,
    GoMap,
    GoSlice,
    GoStruct,
    decode_struct,
    go_bool,
    go_int,
    go_marshal,
    json_schema,
    unmarshal_strings,
)

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


@pytest.mark.parametrize("size", [0, 1, 2, 3, 1 << 20])
@pytest.mark.parametrize("newlines", [False, True])
def test_base64_data_of_any_length_decodes_whole(size: int, newlines: bool) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    text = base64.b64encode(data).decode()
    if newlines:  # Go skips CR and LF
        text = "\r\n".join(text[i : i + 76] for i in range(0, len(text), 76)) + "\n"
    frame = json.dumps({"stdin": {"data": text}})
    assert decode_struct(frame, REQUEST)["stdin"]["data"] == data


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
        ('{"stdin": {"data": "aGk=x"}}', "illegal base64 data at input byte 4"),
        ('{"stdin": {"data": "aG==x"}}', "illegal base64 data at input byte 4"),
        ('{"stdin": {"data": "aG=x"}}', "illegal base64 data at input byte 2"),
        ('{"stdin": {"data": "aG="}}', "illegal base64 data at input byte 3"),
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


FILE = GoStruct("dto.File", {"path": "string", "content": "[]uint8"})
ENVIRONMENT = GoStruct(
    "dto.ExecutionEnvironmentRequest",
    {"prewarmingPoolSize": "uint", "exposedPorts": GoSlice("uint16"), "copy": GoSlice(FILE)},
)


EXECUTION = GoStruct("dto.ExecutionRequest", {"environment": GoMap("string")})


def test_maps_of_strings() -> None:
    assert decode_struct("{}", EXECUTION) == {"environment": None}
    decoded = decode_struct('{"environment": {"A": "1", "B": null}}', EXECUTION)
    assert decoded == {"environment": {"A": "1", "B": ""}}
    with pytest.raises(GoJSONError) as refused:
        decode_struct('{"environment": ["A=1"]}', EXECUTION)
    assert refused.value.message == (
        "json: cannot unmarshal array into Go struct field ExecutionRequest.environment "
        "of type map[string]string"
    )


def test_unsigned_integers_slices_and_their_zero_values() -> None:
    assert decode_struct("{}", ENVIRONMENT) == {
        "prewarmingPoolSize": 0,
        "exposedPorts": None,
        "copy": None,
    }
    decoded = decode_struct(
        '{"prewarmingPoolSize": 5, "exposedPorts": [80, null, 65535],'
        ' "copy": [{"path": "a/", "content": null}, {"path": "b", "content": "aGk="}]}',
        ENVIRONMENT,
    )
    assert decoded == {
        "prewarmingPoolSize": 5,
        "exposedPorts": [80, 0, 65535],
        "copy": [{"path": "a/", "content": None}, {"path": "b", "content": b"hi"}],
    }
    # null in a slice of structs is the struct's zero value, as in Go.
    assert decode_struct('{"copy": [null]}', ENVIRONMENT)["copy"] == [{"path": "", "content": None}]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            '{"prewarmingPoolSize": -1}',
            "json: cannot unmarshal number -1 into Go struct field "
            "ExecutionEnvironmentRequest.prewarmingPoolSize of type uint",
        ),
        (
            '{"prewarmingPoolSize": "5"}',
            "json: cannot unmarshal string into Go struct field "
            "ExecutionEnvironmentRequest.prewarmingPoolSize of type uint",
        ),
        (
            '{"exposedPorts": [80, 70000]}',
            "json: cannot unmarshal number 70000 into Go struct field "
            "ExecutionEnvironmentRequest.exposedPorts of type uint16",
        ),
        (
            '{"exposedPorts": "80"}',
            "json: cannot unmarshal string into Go struct field "
            "ExecutionEnvironmentRequest.exposedPorts of type []uint16",
        ),
        (
            '{"copy": [{"path": 1}]}',
            "json: cannot unmarshal number into Go struct field File.copy.path of type string",
        ),
        (
            '{"copy": {"path": "a"}}',
            "json: cannot unmarshal object into Go struct field "
            "ExecutionEnvironmentRequest.copy of type []dto.File",
        ),
        ('{"copy": [{"content": "abc"}]}', "illegal base64 data at input byte 0"),
    ],
)
def test_errors_of_unsigned_integers_and_slices(raw: str, message: str) -> None:
    with pytest.raises(GoJSONError) as refused:
        decode_struct(raw, ENVIRONMENT)
    assert refused.value.message == message


def test_strconv_texts() -> None:
    assert go_bool("T") is True
    assert go_bool("0") is False
    with pytest.raises(ValueError, match=r'^strconv.ParseBool: parsing "yes": invalid syntax$'):
        go_bool("yes")
    assert go_int("-12") == -12
    with pytest.raises(ValueError, match=r'^strconv.ParseInt: parsing "1x": invalid syntax$'):
        go_int("1x")
    with pytest.raises(ValueError, match="value out of range"):
        go_int(str(2**63))


def test_marshal_is_compact_utf8_with_go_html_escapes() -> None:
    text = go_marshal({"message": "a <b> & c\u2028", "é": [1, None, True]})
    assert text == '{"message":"a \\u003cb\\u003e \\u0026 c\\u2028","é":[1,null,true]}'


STRUCT = GoStruct(
    "dto.Example",
    {
        "size": "uint16",
        "count": "int",
        "name": "string",
        "on": "bool",
        "data": "[]uint8",
        "tags": GoSlice("string"),
        "labels": GoMap("string"),
    },
)


@pytest.mark.parametrize(
    "raw",
    [
        '{"size": 65535, "count": -3, "name": "x", "on": true, "data": "aGk=",'
        ' "tags": ["a"], "labels": {"k": "v"}, "unknown": [1]}',
        '{"data": null, "tags": null, "labels": null}',
        "{}",
        # null leaves any other field as it is (its zero value), and is an item's zero
        '{"size": null, "count": null, "name": null, "on": null, "tags": [null],'
        ' "labels": {"k": null}}',
        "null",
    ],
)
def test_the_json_schema_takes_what_go_decodes(raw: str) -> None:
    decode_struct(raw, STRUCT)  # Go takes it
    jsonschema.validate(json.loads(raw), json_schema(STRUCT))


@pytest.mark.parametrize(
    "raw",
    [
        '{"size": 65536}',
        '{"size": -1}',
        '{"count": 9223372036854775808}',
        '{"name": 5}',
        '{"on": "true"}',
        '{"data": "aGk"}',
        '{"tags": [1]}',
        '{"labels": {"k": 1}}',
    ],
)
def test_the_json_schema_refuses_what_go_refuses(raw: str) -> None:
    with pytest.raises(GoJSONError):
        decode_struct(raw, STRUCT)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(raw), json_schema(STRUCT))


# ---- what a hostile client sends: deep nesting, huge numbers, lone surrogates -------------

RUNNER = GoStruct(
    "dto.RunnerRequest", {"executionEnvironmentId": "int", "inactivityTimeout": "int"}
)
FILES = GoStruct(
    "dto.UpdateFileSystemRequest",
    {"delete": GoSlice("string"), "copy": GoSlice(GoStruct("dto.File", {"path": "string"}))},
)
COMMAND = GoStruct("dto.ExecutionRequest", {"command": "string", "environment": GoMap("string")})


def nested(depth: int, inner: str = "") -> str:
    return "[" * depth + inner + "]" * depth


@pytest.mark.parametrize("depth", [3_000, 10_000])
def test_nesting_within_gos_limit_is_read(depth: int) -> None:
    """Go reads 10,000 levels; Python's parser stops near 1,000."""
    with pytest.raises(GoJSONError) as refused:
        decode_struct(nested(depth), RUNNER)
    assert (
        refused.value.message
        == "json: cannot unmarshal array into Go value of type dto.RunnerRequest"
    )
    ignored = '{"x": ' + nested(depth - 3, '{"a": [1, "b"]}') + ', "executionEnvironmentId": 10}'
    assert decode_struct(ignored, RUNNER) == {"executionEnvironmentId": 10, "inactivityTimeout": 0}
    with pytest.raises(GoJSONError) as refused:
        decode_struct('{"copy": ' + nested(depth - 1) + "}", FILES)
    assert refused.value.message == (
        "json: cannot unmarshal array into Go struct field UpdateFileSystemRequest.copy "
        "of type dto.File"
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (nested(10_001), "exceeded max depth"),
        ('{"x": ' + nested(20_000) + "}", "exceeded max depth"),
        (nested(3_000)[:-1], "unexpected EOF"),
        ("[" * 3_000 + "1 2", "invalid character '2' after array element"),
        ('{"a": ' + "[" * 3_000 + '{"b" 1', "invalid character '1' after object key"),
        (
            '{"a": ' + "[" * 3_000 + "{'b'",
            "invalid character '\\'' looking for beginning of object key string",
        ),
        ("[" * 3_000 + '{"a": 1 "b"', "invalid character '\"' after object key:value pair"),
        ("[" * 3_000 + "nul]", "invalid character ']' in literal null (expecting 'l')"),
        ("[" * 3_000 + "NaN", "invalid character 'N' looking for beginning of value"),
    ],
)
def test_deep_nesting_errors_read_as_go_writes_them(raw: str, message: str) -> None:
    with pytest.raises(GoJSONError) as refused:
        decode_struct(raw, RUNNER)
    assert refused.value.message == message


def test_numbers_of_any_length_are_read_as_go_reads_them() -> None:
    huge = "1" + "0" * 4_300
    with pytest.raises(GoJSONError) as refused:
        decode_struct(f'{{"executionEnvironmentId": {huge}}}', RUNNER)
    assert refused.value.message == (
        f"json: cannot unmarshal number {huge} into Go struct field "
        "RunnerRequest.executionEnvironmentId of type int"
    )
    with pytest.raises(GoJSONError) as refused:
        decode_struct('{"inactivityTimeout": 1e999}', RUNNER)
    assert refused.value.message == (
        "json: cannot unmarshal number 1e999 into Go struct field "
        "RunnerRequest.inactivityTimeout of type int"
    )
    with pytest.raises(GoJSONError) as refused:
        decode_struct(f'{{"command": -{huge}}}', COMMAND)
    assert refused.value.message == (
        "json: cannot unmarshal number into Go struct field ExecutionRequest.command of type string"
    )
    assert decode_struct(f'{{"x": [{huge}, 1.5e99999], "inactivityTimeout": 60}}', RUNNER) == {
        "executionEnvironmentId": 0,
        "inactivityTimeout": 60,
    }


def test_lone_surrogates_are_replaced_as_go_replaces_them() -> None:
    """Go's decoder makes U+FFFD of an escaped surrogate that is not half of a pair."""
    decoded = decode_struct(
        '{"command": "a\\ud800b\\udc00\\ud83d\\ude00", "environment": {"K\\udfff": "v\\ud800"}}',
        COMMAND,
    )
    assert decoded == {
        "command": "a\ufffdb\ufffd\U0001f600",
        "environment": {"K\ufffd": "v\ufffd"},
    }
    assert decode_struct('{"delete": ["x\\ud800"], "copy": [{"path": "\\udc00"}]}', FILES) == {
        "delete": ["x\ufffd"],
        "copy": [{"path": "\ufffd"}],
    }
    assert unmarshal_strings('["\\ud800", "ok"]') == ["\ufffd", "ok"]
