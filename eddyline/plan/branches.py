"""One read for a step whose inputs branch off one node.

Spark runs a shared part of a plan once per reference to it. A join of auctions and bids that
are two ``filter`` steps over one broker source is a union of two reads of that source: its
Python step, its broker fetch and its decoding run twice an epoch. When every input of a step
reaches one node through ``filter`` and ``select`` steps only, each input's chain can be folded
into a condition and one expression per column over that node's columns (what Spark's optimizer
does to each branch on its own), and the step's rows made from a single read of the node: every
row of it gives one row per input whose condition it meets.

Folding rewrites SQL text: a column name is replaced by the parenthesised expression that made
it, and everything else is left as it was written. Anything the fold cannot be sure of is
refused (``None``), and the step reads its inputs as they are: a ``*``, a lambda, a struct field,
a subquery, an aggregate or window, a function that is not deterministic, an expression without a
name Spark would give it (``a + 1`` without ``AS``), or a name that occurs as something other
than a column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eddyline.api.network import NetworkSpec
    from eddyline.api.steps import StepSpec

#: the step kinds a chain may pass through: both only keep or compute columns row by row
CHAIN_KINDS = ("filter", "select")

#: functions whose value differs between two evaluations of one row: folded, a select's column
#: would be evaluated once per later use instead of once
_NOT_DETERMINISTIC = frozenset({
    "rand", "randn", "random", "uuid", "shuffle", "monotonically_increasing_id", "spark_partition_id",
    "input_file_name", "input_file_block_start", "input_file_block_length", "reflect", "java_method",
    "try_reflect", "randstr", "uniform",
})


@dataclass(frozen=True)
class Branch:
    """One input of a step, as SQL over the shared node's columns."""

    #: the rows it keeps (None: all)
    condition: str | None
    #: its columns in order: name -> SQL
    columns: tuple[tuple[str, str], ...]

    def lookup(self) -> dict[str, str]:
        return _scope(self.columns)


def _scope(columns: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """Columns by their name in lower case, as Spark resolves them."""
    return {name.lower(): sql for name, sql in columns}


def shared_node(spec: NetworkSpec, step: StepSpec) -> tuple[str, list[list[StepSpec]]] | None:
    """The node every input of ``step`` reaches through filters and selects only, and each input's
    chain of those steps from that node on (empty: the input is the node). None when the inputs
    reach different nodes or the step has fewer than two."""
    if len(step.inputs) < 2:
        return None
    found: list[tuple[str, list[StepSpec]]] = []
    for name in step.inputs:
        chain: list[StepSpec] = []
        node = name
        while True:
            try:
                s = spec.step(node)
            except KeyError:  # a source
                break
            if s.kind not in CHAIN_KINDS:
                break
            chain.append(s)
            node = s.inputs[0]
        found.append((node, chain[::-1]))
    if len({node for node, _ in found}) != 1:
        return None
    return found[0][0], [chain for _, chain in found]


def fold(columns: list[str], chain: list[StepSpec]) -> Branch | None:
    """``chain`` (filters and selects, in order) over a node with ``columns``, as one branch."""
    current: tuple[tuple[str, str], ...] = tuple((c, quoted(c)) for c in columns)
    conditions: list[str] = []
    for s in chain:
        scope = _scope(current)
        if len(scope) != len(current):  # two columns one name apart only in case
            return None
        if s.kind == "filter":
            cond = substitute(s.params, scope)
            if cond is None:
                return None
            conditions.append(f"({cond})")
            continue
        out = []
        for text in s.params:
            named = split_name(text)
            if named is None:
                return None
            name, expr = named
            sql = substitute(expr, scope)
            if sql is None:
                return None
            out.append((name, sql))
        if len({n.lower() for n, _ in out}) != len(out):
            return None
        current = tuple(out)
    return Branch(" AND ".join(conditions) or None, current)


def quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _tokens(text: str) -> list | None:
    from sqlglot.dialects.spark import Spark
    from sqlglot.errors import SqlglotError

    try:
        return Spark().tokenize(text)
    except SqlglotError:
        return None


def _tree(text: str):  # noqa: ANN202 - sqlglot's expression, or None
    import sqlglot
    from sqlglot.errors import SqlglotError

    try:
        return sqlglot.parse_one(text, read="spark")
    except SqlglotError:
        return None


def split_name(text: str) -> tuple[str, str] | None:
    """A select expression's output name and its SQL without the name: ``a`` -> (a, a),
    ``b * 2 AS c`` -> (c, b * 2). None where Spark would make the name up, or it is unclear."""
    from sqlglot import exp
    from sqlglot.tokens import TokenType

    tree, tokens = _tree(text), _tokens(text)
    if tree is None or tokens is None:
        return None
    if isinstance(tree, exp.Column):
        return (tree.name, text) if not tree.table else None
    if not isinstance(tree, exp.Alias):
        return None
    depth, cut = 0, None
    for i, tok in enumerate(tokens):
        if tok.token_type in (TokenType.L_PAREN, TokenType.L_BRACKET):
            depth += 1
        elif tok.token_type in (TokenType.R_PAREN, TokenType.R_BRACKET):
            depth -= 1
        elif tok.token_type == TokenType.ALIAS and depth == 0:
            cut = i
    if cut is None or cut != len(tokens) - 2:  # ``expr AS name`` and nothing after the name
        return None
    return tree.alias, text[: tokens[cut].start].rstrip()


def substitute(text: str, scope: dict[str, str]) -> str | None:
    """``text`` with every column it reads replaced by ``(scope[name])`` (names in lower case).
    None when a column is not in ``scope`` or the text holds what folding must not touch."""
    from sqlglot import exp
    from sqlglot.tokens import TokenType

    tree, tokens = _tree(text), _tokens(text)
    if tree is None or tokens is None:
        return None
    refused = (exp.Star, exp.Lambda, exp.Subquery, exp.Select, exp.Window, exp.AggFunc, exp.Rand, exp.Randn, exp.Uuid)
    if any(True for _ in tree.find_all(*refused)):
        return None
    for f in tree.find_all(exp.Func):
        name = f.name if isinstance(f, exp.Anonymous) else f.sql_name()
        if name.lower() in _NOT_DETERMINISTIC:
            return None
    columns = list(tree.find_all(exp.Column))
    if any(c.table for c in columns):  # ``a.b``: a struct's field or a qualified name
        return None
    names = {c.name.lower() for c in columns}
    if not names <= scope.keys():
        return None
    kinds = (TokenType.VAR, TokenType.IDENTIFIER)
    out, at, replaced = [], 0, 0
    for i, tok in enumerate(tokens):
        if tok.token_type in (TokenType.DOT, TokenType.ARROW, TokenType.FARROW):
            return None
        if tok.token_type not in kinds or tok.text.lower() not in names:
            continue
        before = tokens[i - 1].token_type if i else None
        after = tokens[i + 1].token_type if i + 1 < len(tokens) else None
        if after == TokenType.L_PAREN or before == TokenType.ALIAS:  # a function, a name given
            continue
        out.append(text[at: tok.start])
        out.append(f"({scope[tok.text.lower()]})")
        at, replaced = tok.end + 1, replaced + 1
    if replaced != len(columns):  # a column's name also stands for something else in the text
        return None
    out.append(text[at:])
    return "".join(out)
