"""A small go-bexpr subset: the filter language of Nomad's list endpoints.

Supported: `==`, `!=`, `matches`, `not matches`, `contains`, `not contains`,
`in`, `not in`, `is empty`, `is not empty`, `and`, `or`, `not`, parentheses,
dotted selectors (`Meta.pool`, `TaskStates.web.State`), double-quoted or
backtick strings, numbers, booleans and bare words as values.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

Predicate = Callable[[Any], bool]

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<lp>\() | (?P<rp>\)) | (?P<op>==|!=)
    | "(?P<dq>(?:[^"\\]|\\.)*)"
    | `(?P<bq>[^`]*)`
    | (?P<word>[A-Za-z0-9_\-./\[\]]+)
    )""",
    re.VERBOSE,
)
_MISSING = object()


class FilterError(ValueError):
    """A filter that does not parse; the message mimics go-bexpr's position prefix."""


@dataclass(frozen=True)
class _Tok:
    kind: str  # lp, rp, op, str, word, end
    text: str
    pos: int


def _tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            start = len(text) - len(text[pos:].lstrip())
            raise FilterError(f"1:{start + 1} ({start}): no match found, expected a token")
        kind = m.lastgroup or "word"
        start = m.start(kind)
        if kind in ("dq", "bq"):
            raw = m.group(kind)
            value = re.sub(r"\\(.)", r"\1", raw) if kind == "dq" else raw
            toks.append(_Tok("str", value, start))
        else:
            toks.append(_Tok(kind, m.group(kind), start))
        pos = m.end()
    toks.append(_Tok("end", "", len(text)))
    return toks


def _resolve(obj: Any, selector: str) -> Any:
    cur = obj
    for part in selector.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return _MISSING
    return cur


def _coerce_equal(actual: Any, literal: str) -> bool:
    if isinstance(actual, bool):
        return literal.lower() == ("true" if actual else "false")
    if isinstance(actual, int | float):
        try:
            return float(literal) == float(actual)
        except ValueError:
            return False
    if actual is None:
        return literal == ""
    if isinstance(actual, str):
        return actual == literal
    return False


def _contains(actual: Any, literal: str) -> bool:
    if isinstance(actual, str):
        return literal in actual
    if isinstance(actual, dict):
        return literal in actual
    if isinstance(actual, list):
        return any(_coerce_equal(item, literal) for item in actual)
    return False


def _is_empty(actual: Any) -> bool:
    return actual is _MISSING or actual is None or actual in ("", [], {})


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokenize(text)
        self.i = 0

    def peek(self, offset: int = 0) -> _Tok:
        return self.toks[min(self.i + offset, len(self.toks) - 1)]

    def take(self) -> _Tok:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def fail(self, expected: str) -> FilterError:
        tok = self.peek()
        return FilterError(f"1:{tok.pos + 1} ({tok.pos}): no match found, expected: {expected}")

    def is_word(self, word: str, offset: int = 0) -> bool:
        tok = self.peek(offset)
        return tok.kind == "word" and tok.text == word

    def parse(self) -> Predicate:
        pred = self.parse_or()
        if self.peek().kind != "end":
            raise self.fail('"and", "or" or end of input')
        return pred

    def parse_or(self) -> Predicate:
        return self._joined("or", self.parse_and, any)

    def parse_and(self) -> Predicate:
        return self._joined("and", self.parse_unary, all)

    def _joined(
        self,
        word: str,
        parse_operand: Callable[[], Predicate],
        combine: Callable[[Iterable[bool]], bool],
    ) -> Predicate:
        """Operands joined by `word` (`or`: any of them holds, `and`: all of them hold)."""
        parts = [parse_operand()]
        while self.is_word(word):
            self.take()
            parts.append(parse_operand())
        if len(parts) == 1:
            return parts[0]
        return lambda obj: combine(p(obj) for p in parts)

    def parse_unary(self) -> Predicate:
        if self.is_word("not"):
            self.take()
            inner = self.parse_unary()
            return lambda obj: not inner(obj)
        if self.peek().kind == "lp":
            self.take()
            inner = self.parse_or()
            if self.peek().kind != "rp":
                raise self.fail('")"')
            self.take()
            return inner
        return self.parse_match()

    def value(self) -> str:
        tok = self.peek()
        if tok.kind not in ("str", "word") or tok.text in ("and", "or"):
            raise self.fail("a value")
        self.take()
        return tok.text

    def parse_match(self) -> Predicate:
        first = self.peek()
        if first.kind not in ("str", "word"):
            raise self.fail('a selector, a value, "not" or "("')
        # `<value> in <selector>` / `<value> not in <selector>`
        negate = self.is_word("not", 1) and self.is_word("in", 2)
        if self.is_word("in", 1) or negate:
            literal = self.take().text
            self.i += 2 if negate else 1
            selector = self.selector()
            return self._negated(lambda obj: _contains(_resolve(obj, selector), literal), negate)
        selector = self.selector() if first.kind == "word" else ""
        if not selector:
            raise self.fail("a selector")
        tok = self.peek()
        if tok.kind == "op":
            self.take()
            literal = self.value()
            if tok.text == "==":
                return lambda obj: _coerce_equal(_resolve(obj, selector), literal)
            return lambda obj: not _coerce_equal(_resolve(obj, selector), literal)
        negate = self.is_word("not")
        if negate:
            self.take()
        if self.is_word("matches"):
            self.take()
            try:
                pattern = re.compile(self.value())
            except re.error as exc:
                raise FilterError(f"invalid regular expression: {exc}") from exc

            def matches(obj: Any) -> bool:
                actual = _resolve(obj, selector)
                return isinstance(actual, str) and pattern.search(actual) is not None

            return self._negated(matches, negate)
        if self.is_word("contains"):
            self.take()
            literal = self.value()
            return self._negated(lambda obj: _contains(_resolve(obj, selector), literal), negate)
        if not negate and self.is_word("is"):
            self.take()
            empty_negate = self.is_word("not")
            if empty_negate:
                self.take()
            if not self.is_word("empty"):
                raise self.fail('"empty"')
            self.take()
            return self._negated(lambda obj: _is_empty(_resolve(obj, selector)), empty_negate)
        raise self.fail('"==", "!=", "matches", "contains", "in" or "is"')

    def selector(self) -> str:
        tok = self.take()
        if tok.kind != "word" or not re.match(r"^[A-Za-z_][A-Za-z0-9_\-./]*$", tok.text):
            self.i -= 1
            raise self.fail("a selector")
        return tok.text

    @staticmethod
    def _negated(pred: Predicate, negate: bool) -> Predicate:
        return (lambda obj: not pred(obj)) if negate else pred


def compile_filter(text: str) -> Predicate:
    """Compile a filter expression; raises FilterError with a go-bexpr-like message."""
    return _Parser(text).parse()
