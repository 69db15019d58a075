"""The SQL dialect: sqlglot's Spark dialect with what Flink adds (window table functions with
named arguments, ``DESCRIPTOR``, ``WATERMARK FOR``), and :func:`parse`, whose syntax errors name
the line and column."""

from __future__ import annotations

from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.errors import ParseError
from sqlglot.tokens import TokenType

from eddyline.errors import SpecError

WINDOW_TVFS = ("TUMBLE", "HOP", "CUMULATE", "SESSION")


# --------------------------------------------------------------------------- the dialect


def _tvf_args(self: Any) -> list[exp.Expression]:
    """Arguments of a window table function: ``TABLE t [PARTITION BY c]``, ``DESCRIPTOR(c)``,
    intervals, each optionally named (``SIZE => INTERVAL '10' SECOND``)."""
    args: list[exp.Expression] = []
    while True:
        name = None
        if self._curr and self._next and self._next.token_type == TokenType.FARROW:
            name = self._curr.text.upper()
            self._advance(2)
        if self._match(TokenType.TABLE):
            arg = self._parse_table_parts()
            if self._match(TokenType.PARTITION_BY):
                # one column, or several in parentheses (Flink: PARTITION BY (a, b))
                keys = self._parse_wrapped_csv(self._parse_column) if self._curr.token_type == TokenType.L_PAREN \
                    else [self._parse_column()]
                arg = exp.Anonymous(this="PARTITIONED", expressions=[arg, *keys])
        else:
            arg = self._parse_disjunction()
        if arg is None:
            break
        args.append(exp.Kwarg(this=exp.var(name), expression=arg) if name else arg)
        if not self._match(TokenType.COMMA):
            break
    return args


def _tvf_parser(name: str) -> Any:
    return lambda self: exp.Anonymous(this=name, expressions=_tvf_args(self))


def _watermark(self: Any) -> exp.Expression | None:
    if not self._match_text_seq("FOR"):
        return None
    column = self._parse_field()
    self._match(TokenType.ALIAS)
    return exp.WatermarkColumnConstraint(this=column, expression=self._parse_disjunction())


class Flink(Spark):
    """Spark's dialect plus the Flink syntax the subset needs (sqlglot has no Flink dialect)."""

    class Parser(Spark.Parser):
        FUNC_TOKENS = {*Spark.Parser.FUNC_TOKENS, TokenType.SESSION}
        FUNCTION_PARSERS = {**Spark.Parser.FUNCTION_PARSERS, **{n: _tvf_parser(n) for n in WINDOW_TVFS}}
        SCHEMA_UNNAMED_CONSTRAINTS = {*Spark.Parser.SCHEMA_UNNAMED_CONSTRAINTS, "WATERMARK"}
        CONSTRAINT_PARSERS = {**Spark.Parser.CONSTRAINT_PARSERS, "WATERMARK": _watermark}


def parse(text: str) -> list[exp.Expression]:
    """The statements of a script; a syntax error as a SpecError with its line and column."""
    try:
        return [s for s in sqlglot.parse(text, read=Flink) if s is not None]
    except ParseError as e:
        first = e.errors[0] if e.errors else {}
        where = f"line {first.get('line')}, column {first.get('col')}: " if first else ""
        near = (first.get("highlight") or "").strip()
        what = str(first.get("description", e)).strip()
        raise SpecError(f"sql: syntax error at {where}{what}{f' near {near!r}' if near else ''}") from None
