"""A small reader for the HCL (version 1) that Nomad's ACL policies are written in.

Nomad decodes policies with hashicorp/hcl v1, which also takes JSON. Both forms are read
into one shape, a `Body`: each key maps to the list of its values, in order (a key may
repeat, as `namespace` blocks do). A block `namespace "default" { ... }` is the value
`{"default": [body]}` under `namespace`; a block without a label is its body.

The subset: attributes (`key = value`), blocks with quoted or bare labels, strings,
numbers, booleans, lists, `#`, `//` and `/* */` comments. No heredocs or expressions.
"""

from __future__ import annotations

import json
import re
from typing import Any

Body = dict[str, list[Any]]

_TOKEN = re.compile(
    r"""
    (?P<skip>[ \t\r\n]+|\#[^\n]*|//[^\n]*|/\*.*?\*/)
    | (?P<string>"(?:[^"\\\n]|\\.)*")
    | (?P<number>-?\d+(?:\.\d+)?)
    | (?P<ident>[A-Za-z_][A-Za-z0-9_\-.]*)
    | (?P<punct>[{}\[\]=,])
    """,
    re.VERBOSE | re.DOTALL,
)


class HclError(ValueError):
    """A policy that is neither HCL nor JSON of the expected shape."""


def parse(text: str) -> Body:
    if text.lstrip().startswith("{"):
        try:
            document = json.loads(text)
        except ValueError as exc:
            raise HclError(f"invalid JSON: {exc}") from None
        if not isinstance(document, dict):
            raise HclError("the root should be an object")
        return _body_from_json(document)
    return _Parser(text).document()


def _body_from_json(obj: dict[str, Any]) -> Body:
    body: Body = {}
    for key, value in obj.items():
        entries = body.setdefault(key, [])
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            entries.extend(_body_from_json(v) for v in value)  # a repeated block
        else:
            entries.append(_body_from_json(value) if isinstance(value, dict) else value)
    return body


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []  # (kind, text, offset)
        pos = 0
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None:
                raise self._error(pos, f"illegal character {text[pos]!r}")
            if match.lastgroup != "skip":
                self.tokens.append((match.lastgroup or "", match.group(), pos))
            pos = match.end()
        self.at = 0

    def document(self) -> Body:
        body = self._body()
        if self.at < len(self.tokens):
            raise self._error(self.tokens[self.at][2], "unexpected '}'")
        return body

    def _body(self) -> Body:
        body: Body = {}
        while self._lookahead() not in ("", "}"):
            kind, key, offset = self._next()
            if kind not in ("ident", "string"):
                raise self._error(offset, f"expected a key, got {key!r}")
            key = json.loads(key) if kind == "string" else key
            if self._peek() == "=":
                self._next()
                body.setdefault(key, []).append(self._value())
            else:
                body.setdefault(key, []).append(self._block())
            if self._lookahead() == ",":
                self._next()
        return body

    def _block(self) -> Any:
        labels: list[str] = []
        while self._peek() != "{":
            kind, label, offset = self._next()
            if kind not in ("ident", "string"):
                raise self._error(offset, f"expected a label or '{{', got {label!r}")
            labels.append(json.loads(label) if kind == "string" else label)
        value: Any = self._object()
        for label in reversed(labels):
            value = {label: [value]}
        return value

    def _object(self) -> Body:
        self._expect("{")
        body = self._body()
        self._expect("}")
        return body

    def _value(self) -> Any:
        kind, token, offset = self.tokens[self.at] if self.at < len(self.tokens) else ("", "", 0)
        if token == "{":
            return self._object()
        if token == "[":
            self._next()
            items = []
            while self._peek() != "]":
                items.append(self._value())
                if self._peek() == ",":
                    self._next()
            self._next()
            return items
        self._next()
        if kind == "string":
            return json.loads(token)
        if kind == "number":
            return json.loads(token)
        if token in ("true", "false"):
            return token == "true"
        raise self._error(offset, f"unexpected {token!r}")

    def _lookahead(self) -> str:
        """The next token, or "" at the end of the input."""
        return self.tokens[self.at][1] if self.at < len(self.tokens) else ""

    def _peek(self) -> str:
        if self.at >= len(self.tokens):
            raise self._error(len(self.text), "unexpected end of input")
        return self.tokens[self.at][1]

    def _next(self) -> tuple[str, str, int]:
        self._peek()
        token = self.tokens[self.at]
        self.at += 1
        return token

    def _expect(self, punct: str) -> None:
        _, token, offset = self._next()
        if token != punct:
            raise self._error(offset, f"expected {punct!r}, got {token!r}")

    def _error(self, offset: int, message: str) -> HclError:
        line = self.text.count("\n", 0, offset) + 1
        column = offset - (self.text.rfind("\n", 0, offset) + 1) + 1
        return HclError(f"At {line}:{column}: {message}")
