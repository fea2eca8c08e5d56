"""Go's encoding/json as a Nomad agent's clients see it: the values it decodes into Go
types, and the error texts it gives (syntax, Go types, base64), which Nomad passes on."""

from __future__ import annotations

import binascii
import json
import string
from dataclasses import dataclass
from typing import Any

from controller.lab.simulator.util import JSON

_GO_WHITESPACE = " \t\r\n"
_BASE64 = frozenset(string.ascii_letters + string.digits + "+/")
_INT_BITS = {"int": 64, "int32": 32}
_ZERO: dict[str, Any] = {"string": "", "bool": False, "int": 0, "int32": 0, "[]uint8": None}


class GoJSONError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class GoStruct:
    """A Go struct to decode into: its type name and its fields' JSON names and Go types
    ("string", "bool", "int", "int32", "[]uint8" from base64, or a nested struct)."""

    name: str
    fields: dict[str, str | GoStruct]


def _reject_constant(name: str) -> Any:
    # Python reads NaN and (-)Infinity, which Go's JSON does not.
    if name.startswith("-"):
        raise GoJSONError(f"invalid character {_quote_char(name[1])} in numeric literal")
    raise GoJSONError(f"invalid character {_quote_char(name[0])} looking for beginning of value")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def decode_struct(raw: str, struct: GoStruct) -> JSON:
    """The first JSON value of `raw` decoded into `struct` as a json.Decoder does (what
    follows it is not read; missing fields get Go's zero values, null ones too).

    EOFError for a frame of nothing but whitespace (Go's io.EOF); GoJSONError otherwise.
    """
    text = raw.lstrip(_GO_WHITESPACE)
    if not text:
        raise EOFError
    value = _parse(text, "unexpected EOF", whole=False)
    if value is not None and not isinstance(value, dict):
        raise _type_error(value, None, "", struct.name)
    return _into_struct(value or {}, struct, "")


def unmarshal_strings(raw: str) -> list[str] | None:
    """`raw` decoded as json.Unmarshal does into a Go []string (null: nil)."""
    value = _parse(raw.strip(_GO_WHITESPACE), "unexpected end of JSON input", whole=True)
    if value is None:
        return None
    if not isinstance(value, list):
        raise _type_error(value, None, "", "[]string")
    for item in value:
        if item is not None and not isinstance(item, str):
            raise _type_error(item, None, "", "string")
    return ["" if item is None else item for item in value]


def go_quote(text: str) -> str:
    """Go's strconv.Quote, for the texts the simulator quotes in Go's error messages."""
    return json.dumps(text, ensure_ascii=False)


# ---------------------------------------------------------------------- decoding
def _parse(text: str, eof_message: str, whole: bool) -> Any:
    try:
        value, end = _DECODER.raw_decode(text)
    except json.JSONDecodeError as exc:
        raise GoJSONError(_syntax_error(text, exc, eof_message)) from None
    rest = len(text) - len(text[end:].lstrip(_GO_WHITESPACE))
    if whole and rest < len(text):
        raise GoJSONError(f"invalid character {_quote_char(text[rest])} after top-level value")
    return value


def _into_struct(obj: JSON, struct: GoStruct, path: str) -> JSON:
    out: JSON = {
        name: None if isinstance(kind, GoStruct) else _ZERO[kind]
        for name, kind in struct.fields.items()
    }
    for key, value in obj.items():
        name = key if key in struct.fields else _fold(key, struct.fields)
        if name is None or value is None:
            continue  # Go ignores unknown keys, and null leaves a field as it is
        kind = struct.fields[name]
        where = f"{path}.{name}" if path else name
        if isinstance(kind, GoStruct):
            if not isinstance(value, dict):
                raise _type_error(value, struct, where, kind.name)
            out[name] = _into_struct(value, kind, where)
        else:
            out[name] = _scalar(value, kind, struct, where)
    return out


def _scalar(value: Any, kind: str, struct: GoStruct, where: str) -> Any:
    if kind == "string" and isinstance(value, str):
        return value
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind in _INT_BITS and isinstance(value, int | float) and not isinstance(value, bool):
        limit = 1 << (_INT_BITS[kind] - 1)
        if isinstance(value, int) and -limit <= value < limit:
            return value
        raise _type_error(value, struct, where, kind, number=f"number {value}")
    if kind == "[]uint8" and isinstance(value, str):
        return _base64(value)
    raise _type_error(value, struct, where, kind)


def _fold(key: str, fields: dict[str, Any]) -> str | None:
    # Go matches a key that is not a field's exact name case-insensitively.
    return next((name for name in fields if name.lower() == key.lower()), None)


def _base64(text: str) -> bytes:
    """Go's base64.StdEncoding (padding required; CR and LF skipped), and where it fails."""
    chars = [(i, ch) for i, ch in enumerate(text) if ch not in "\r\n"]
    for start in range(0, len(chars), 4):
        group = chars[start : start + 4]
        for j, (i, ch) in enumerate(group):
            if ch == "=":
                padding = "".join(c for _, c in chars[start + j :])
                if j < 2 or padding != "=" * (4 - j):
                    raise GoJSONError(f"illegal base64 data at input byte {i}")
                break
            if ch not in _BASE64:
                raise GoJSONError(f"illegal base64 data at input byte {i}")
        else:
            if len(group) < 4:
                raise GoJSONError(f"illegal base64 data at input byte {group[0][0]}")
    return binascii.a2b_base64("".join(c for _, c in chars).encode())


# ---------------------------------------------------------------------- error texts
def _type_error(
    value: Any, struct: GoStruct | None, where: str, go_type: str, number: str = ""
) -> GoJSONError:
    if isinstance(value, bool):
        kind = "bool"
    elif isinstance(value, int | float):
        kind = number or "number"
    else:
        kind = (
            "string" if isinstance(value, str) else "array" if isinstance(value, list) else "object"
        )
    if struct is None:
        return GoJSONError(f"json: cannot unmarshal {kind} into Go value of type {go_type}")
    owner = struct.name.rsplit(".", 1)[-1]
    return GoJSONError(
        f"json: cannot unmarshal {kind} into Go struct field {owner}.{where} of type {go_type}"
    )


def _syntax_error(text: str, exc: json.JSONDecodeError, eof_message: str) -> str:
    pos, msg = exc.pos, exc.msg
    if msg.startswith("Invalid \\escape"):
        pos += 1  # Python points at the backslash, Go at the character after it
    if pos >= len(text) or msg.startswith("Unterminated string"):
        return eof_message
    if msg.startswith("Expecting property name"):
        context = "looking for beginning of object key string"
    elif msg.startswith("Expecting ':'"):
        context = "after object key"
    elif msg.startswith("Expecting ','"):
        in_object = _innermost(text, pos) == "{"
        context = "after object key:value pair" if in_object else "after array element"
    elif msg.startswith("Invalid control character"):
        context = "in string literal"
    elif msg.startswith("Invalid \\escape"):
        context = "in string escape code"
    else:
        return _value_error(text, pos, eof_message)
    return f"invalid character {_quote_char(text[pos])} {context}"


def _value_error(text: str, pos: int, eof_message: str) -> str:
    """Where a value should begin: Go reads on into a literal or a number before failing."""
    for literal in ("null", "true", "false"):
        if text[pos] == literal[0]:
            for i, expected in enumerate(literal[1:], pos + 1):
                if i >= len(text):
                    return eof_message
                if text[i] != expected:
                    got = _quote_char(text[i])
                    return f"invalid character {got} in literal {literal} (expecting '{expected}')"
    if text[pos] == "-":
        if pos + 1 >= len(text):
            return eof_message
        return f"invalid character {_quote_char(text[pos + 1])} in numeric literal"
    return f"invalid character {_quote_char(text[pos])} looking for beginning of value"


def _innermost(text: str, pos: int) -> str:
    """The bracket open at `pos` ("{", "[" or ""), strings skipped."""
    opened: list[str] = []
    in_string = escaped = False
    for ch in text[:pos]:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            opened.append(ch)
        elif ch in "}]" and opened:
            opened.pop()
    return opened[-1] if opened else ""


def _quote_char(ch: str) -> str:
    """Go's quoteChar: one byte of the input as its syntax errors show it."""
    if ch == "'":
        return "'\\''"
    if ch == '"':
        return "'\"'"
    escapes = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    if ch in escapes:
        return f"'{escapes[ch]}'"
    code = ch.encode("utf-8", "surrogateescape")[0]
    if code < 0x20 or code >= 0x7F:
        return f"'\\x{code:02x}'"
    return f"'{ch}'"
