"""Go's encoding/json and strconv as clients of Go servers see them: the values they
decode into Go types, and the error texts they give (syntax, Go types, base64, numbers
and booleans), which Nomad and Poseidon pass on. Pure."""

from __future__ import annotations

import binascii
import json
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]

_GO_WHITESPACE = " \t\r\n"
_BASE64 = frozenset(string.ascii_letters + string.digits + "+/")
# Padded standard base64 with nothing to skip: decoded at once, without a search for errors.
_PLAIN_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")
# Integer kinds: (bits, signed).
_INTEGERS = {"int": (64, True), "int32": (32, True), "uint": (64, False), "uint16": (16, False)}
_ZERO: dict[str, Any] = {"string": "", "bool": False, "[]uint8": None} | dict.fromkeys(_INTEGERS, 0)


class GoJSONError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class GoStruct:
    """A Go struct to decode into: its type name and its fields' JSON names and Go types."""

    name: str
    fields: dict[str, GoType]


@dataclass(frozen=True)
class GoSlice:
    """A Go slice of another type (an array in JSON; null is nil)."""

    item: GoType


@dataclass(frozen=True)
class GoMap:
    """A Go map from strings to another type (an object in JSON; null is nil)."""

    value: GoType


# A basic kind ("string", "bool", "int", "int32", "uint", "uint16", "[]uint8" from
# base64), a struct, a slice or a map.
GoType = str | GoStruct | GoSlice | GoMap


# Standard base64 with its padding, as Go's StdEncoding takes it (it also skips CR and LF).
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


def json_schema(kind: GoType) -> JSON:
    """A JSON Schema of values Go's decoder takes into `kind`: a struct's fields by their
    names (others are ignored, so allowed), and null anywhere: Go sets a slice, a map or
    []uint8 to nil, and leaves any other value as it was (a field or item keeps its zero
    value)."""
    if isinstance(kind, GoStruct):
        fields = {name: json_schema(field) for name, field in kind.fields.items()}
        return {"type": ["object", "null"], "properties": fields}
    if isinstance(kind, GoSlice):
        return {"type": ["array", "null"], "items": json_schema(kind.item)}
    if isinstance(kind, GoMap):
        return {"type": ["object", "null"], "additionalProperties": json_schema(kind.value)}
    if kind in _INTEGERS:
        bits, signed = _INTEGERS[kind]
        low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
        return {"type": ["integer", "null"], "minimum": low, "maximum": high}
    if kind == "[]uint8":
        return {"type": ["string", "null"], "contentEncoding": "base64", "pattern": BASE64_PATTERN}
    return {"type": ["boolean" if kind == "bool" else "string", "null"]}


def _type_name(kind: GoType) -> str:
    """The type as Go names it in its errors."""
    if isinstance(kind, GoSlice):
        return "[]" + _type_name(kind.item)
    if isinstance(kind, GoMap):
        return "map[string]" + _type_name(kind.value)
    return kind if isinstance(kind, str) else kind.name


def _reject_constant(name: str) -> Any:
    # Python reads NaN and (-)Infinity, which Go's JSON does not.
    if name.startswith("-"):
        raise GoJSONError(f"invalid character {_quote_char(name[1])} in numeric literal")
    raise GoJSONError(f"invalid character {_quote_char(name[0])} looking for beginning of value")


class _Number(str):
    """A JSON number no Go integer holds (a fraction, an exponent, or more digits than
    Python's int() reads): its text, as Go's errors quote it."""


# Python's int() reads at most 4300 digits (sys.int_info.default_max_str_digits).
_INT_DIGITS = 4300


def _integer(text: str) -> int | _Number:
    return int(text) if len(text) <= _INT_DIGITS else _Number(text)


_DECODER = json.JSONDecoder(
    parse_constant=_reject_constant, parse_float=_Number, parse_int=_integer
)
# The decoder's scanner of one value at an index (typeshed leaves the attribute out).
_scan: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]
# Go's decoder gives up beyond this nesting ("exceeded max depth"); Python's parser
# recurses, and stops far earlier: deeper values are read by _parse_nested.
_MAX_DEPTH = 10_000
_SURROGATE = re.compile("[\ud800-\udfff]")


def go_text(text: str) -> str:
    """A decoded string as Go holds it: an escaped surrogate that is not half of a pair
    (Python keeps it) is U+FFFD."""
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


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
    return ["" if item is None else go_text(item) for item in value]


def go_marshal(value: Any) -> str:
    """`value` as Go's json.Marshal writes it: compact, UTF-8, and with <, >, &, U+2028
    and U+2029 escaped (they can only occur inside strings, so replacing them is safe)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    for char, escape in _HTML_ESCAPES:
        text = text.replace(char, escape)
    return text


_HTML_ESCAPES = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


def go_quote(text: str) -> str:
    """Go's strconv.Quote, for the texts Go's error messages quote."""
    return json.dumps(text, ensure_ascii=False)


_BOOL_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_BOOL_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
GO_BOOLS = _BOOL_TRUE | _BOOL_FALSE  # every text strconv.ParseBool reads
_INT64 = 1 << 63


def go_bool(raw: str) -> bool:
    """Go's strconv.ParseBool; the ValueError carries Go's message."""
    if raw in _BOOL_TRUE:
        return True
    if raw in _BOOL_FALSE:
        return False
    raise ValueError(f"strconv.ParseBool: parsing {go_quote(raw)}: invalid syntax")


def go_int(raw: str) -> int:
    """Go's strconv.ParseInt(raw, 10, 64); the ValueError carries Go's message."""
    digits = raw[1:] if raw[:1] in ("+", "-") else raw
    if not digits or not digits.isascii() or not digits.isdigit():
        raise ValueError(f"strconv.ParseInt: parsing {go_quote(raw)}: invalid syntax")
    value = int(raw)
    if not -_INT64 <= value < _INT64:
        raise ValueError(f"strconv.ParseInt: parsing {go_quote(raw)}: value out of range")
    return value


# ---------------------------------------------------------------------- decoding
def _parse(text: str, eof_message: str, whole: bool) -> Any:
    try:
        value, end = _DECODER.raw_decode(text)
    except json.JSONDecodeError as exc:
        raise GoJSONError(_syntax_error(text, exc, eof_message)) from None
    except RecursionError:
        value, end = _parse_nested(text, eof_message)
    rest = len(text) - len(text[end:].lstrip(_GO_WHITESPACE))
    if whole and rest < len(text):
        raise GoJSONError(f"invalid character {_quote_char(text[rest])} after top-level value")
    return value


def _parse_nested(text: str, eof_message: str) -> tuple[Any, int]:
    """The first JSON value of `text` and where it ends, its arrays and objects read
    without recursion (scalars by Python's scanner): Go's 10,000 levels, and its errors."""
    # Open containers, innermost last: an array, or an object and the key being read.
    stack: list[tuple[list[Any] | JSON, str]] = []
    pos = _skip(text, 0)
    while True:
        if pos >= len(text):
            raise GoJSONError(eof_message)
        value: Any
        if text[pos] in "[{":
            if len(stack) >= _MAX_DEPTH:
                raise GoJSONError("exceeded max depth")
            closing = "]" if text[pos] == "[" else "}"
            pos = _skip(text, pos + 1)
            if text[pos : pos + 1] != closing:
                container: list[Any] | JSON = [] if closing == "]" else {}
                key = ""
                if closing == "}":
                    key, pos = _key(text, pos, eof_message)
                stack.append((container, key))
                continue  # to its first value
            value, pos = ([] if closing == "]" else {}), pos + 1
        else:
            value, pos = _scalar_at(text, pos, eof_message)
        # The value is whole: into its container, then past what follows it.
        while stack:
            container, key = stack[-1]
            if isinstance(container, list):
                container.append(value)
            else:
                container[key] = value
            pos = _skip(text, pos)
            closing = "]" if isinstance(container, list) else "}"
            if pos < len(text) and text[pos] == ",":
                pos = _skip(text, pos + 1)
                if closing == "}":
                    key, pos = _key(text, pos, eof_message)
                    stack[-1] = (container, key)
                break  # to the next value
            if pos < len(text) and text[pos] == closing:
                stack.pop()
                value, pos = container, pos + 1
                continue
            context = "after array element" if closing == "]" else "after object key:value pair"
            raise GoJSONError(_invalid_at(text, pos, context, eof_message))
        else:
            return value, pos


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _GO_WHITESPACE:
        pos += 1
    return pos


def _key(text: str, pos: int, eof_message: str) -> tuple[str, int]:
    """An object's key at `pos` and the colon after it: where its value starts."""
    if text[pos : pos + 1] != '"':
        context = "looking for beginning of object key string"
        raise GoJSONError(_invalid_at(text, pos, context, eof_message))
    key, pos = _scalar_at(text, pos, eof_message)
    pos = _skip(text, pos)
    if text[pos : pos + 1] != ":":
        raise GoJSONError(_invalid_at(text, pos, "after object key", eof_message))
    return key, _skip(text, pos + 1)


def _scalar_at(text: str, pos: int, eof_message: str) -> tuple[Any, int]:
    try:
        value, end = _scan(text, pos)
    except StopIteration:
        raise GoJSONError(_value_error(text, pos, eof_message)) from None
    except json.JSONDecodeError as exc:
        raise GoJSONError(_syntax_error(text, exc, eof_message)) from None
    return value, end


def _invalid_at(text: str, pos: int, context: str, eof_message: str) -> str:
    if pos >= len(text):
        return eof_message
    return f"invalid character {_quote_char(text[pos])} {context}"


def _into_struct(obj: JSON, struct: GoStruct, path: str) -> JSON:
    out: JSON = {name: _zero(kind) for name, kind in struct.fields.items()}
    for key, value in obj.items():
        name = key if key in struct.fields else _fold(key, struct.fields)
        if name is None or value is None:
            continue  # Go ignores unknown keys, and null leaves a field as it is
        out[name] = _decode(value, struct.fields[name], struct, f"{path}.{name}" if path else name)
    return out


def _zero(kind: GoType) -> Any:
    return _ZERO[kind] if isinstance(kind, str) else None


def _zero_item(kind: GoType) -> Any:
    """What a null item of a slice becomes: a struct's zero value is its fields' (struct
    fields themselves stay None, as Go's pointers to structs do)."""
    if isinstance(kind, GoStruct):
        return {name: _zero(field) for name, field in kind.fields.items()}
    return _zero(kind)


def _decode(value: Any, kind: GoType, struct: GoStruct, where: str) -> Any:
    """`value` (not null) as a field of `struct` of type `kind`; a type error names the
    innermost struct and the field's whole path, as Go's does."""
    if isinstance(kind, GoStruct):
        if not isinstance(value, dict):
            raise _type_error(value, struct, where, _type_name(kind))
        return _into_struct(value, kind, where)
    if isinstance(kind, GoSlice):
        if not isinstance(value, list):
            raise _type_error(value, struct, where, _type_name(kind))
        return [
            _zero_item(kind.item) if item is None else _decode(item, kind.item, struct, where)
            for item in value
        ]
    if isinstance(kind, GoMap):
        if not isinstance(value, dict):
            raise _type_error(value, struct, where, _type_name(kind))
        return {
            go_text(key): (
                _zero(kind.value) if item is None else _decode(item, kind.value, struct, where)
            )
            for key, item in value.items()
        }
    return _scalar(value, kind, struct, where)


def _scalar(value: Any, kind: str, struct: GoStruct, where: str) -> Any:
    if isinstance(value, _Number | int) and not isinstance(value, bool):
        if kind not in _INTEGERS:
            raise _type_error(value, struct, where, kind)
        bits, signed = _INTEGERS[kind]
        low, high = (-(1 << (bits - 1)), 1 << (bits - 1)) if signed else (0, 1 << bits)
        if isinstance(value, int) and low <= value < high:
            return value
        raise _type_error(value, struct, where, kind, number=f"number {value}")
    if kind == "string" and isinstance(value, str):
        return go_text(value)
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "[]uint8" and isinstance(value, str):
        return _base64(value)
    raise _type_error(value, struct, where, kind)


def _fold(key: str, fields: dict[str, Any]) -> str | None:
    # Go matches a key that is not a field's exact name case-insensitively.
    return next((name for name in fields if name.lower() == key.lower()), None)


def _base64(text: str) -> bytes:
    """Go's base64.StdEncoding (padding required; CR and LF skipped), and where it fails."""
    if _PLAIN_BASE64.fullmatch(text):
        return binascii.a2b_base64(text.encode())  # an exec's stdin: megabytes, often
    chars = [(i, ch) for i, ch in enumerate(text) if ch not in "\r\n"]
    for start in range(0, len(chars), 4):
        group = chars[start : start + 4]
        for j, (i, ch) in enumerate(group):
            if ch == "=":
                rest = chars[start + j + 1 :]
                if j < 2:
                    raise GoJSONError(f"illegal base64 data at input byte {i}")
                if j == 2:  # a second "=" must follow
                    if not rest:
                        raise GoJSONError(f"illegal base64 data at input byte {len(text)}")
                    if rest[0][1] != "=":
                        raise GoJSONError(f"illegal base64 data at input byte {i}")
                    rest = rest[1:]
                if rest:  # anything after the padding
                    raise GoJSONError(f"illegal base64 data at input byte {rest[0][0]}")
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
    elif isinstance(value, int | _Number):
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
