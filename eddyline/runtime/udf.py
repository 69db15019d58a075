"""Running a user's vectorized function inside Spark tasks, with errors that name the step.

Messages raised in a task travel back inside Spark's Python exception; the ``eddyline:`` prefix
lets the driver pick out the one line that matters (see :func:`task_error_line`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

MARK = "eddyline:"


def resolve(path: str) -> Callable[..., Any]:
    """``"package.module:function"`` → the function (raises ``ValueError`` with the reason)."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or the module failing while it loads
        raise ValueError(f"cannot import module '{module_name}': {type(e).__name__}: {e}") from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"module '{module_name}' has no function '{attr}'")
    return fn


@dataclass(frozen=True)
class UdfRunner:
    step: str
    function: str
    batch: str  # "arrow" | "pandas"
    schema: pa.Schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fn = resolve(self.function)
        for rb in batches:
            try:
                result = fn(rb.to_pandas() if self.batch == "pandas" else rb)
            except Exception as e:
                raise RuntimeError(
                    f"{MARK} step '{self.step}': udf '{self.function}' failed on a batch of {rb.num_rows} rows: "
                    f"{type(e).__name__}: {e}"
                ) from e
            yield self._conform(result)

    def _conform(self, result: Any) -> pa.RecordBatch:
        if self.batch == "pandas":
            import pandas as pd

            if not isinstance(result, pd.DataFrame):
                raise TypeError(f"{MARK} step '{self.step}': udf '{self.function}' returned {type(result).__name__}; expected a pandas DataFrame")
            table = pa.Table.from_pandas(result, preserve_index=False)
        elif isinstance(result, pa.RecordBatch):
            table = pa.Table.from_batches([result])
        elif isinstance(result, pa.Table):
            table = result
        else:
            raise TypeError(
                f"{MARK} step '{self.step}': udf '{self.function}' returned {type(result).__name__}; expected a pyarrow RecordBatch"
            )
        missing = [n for n in self.schema.names if n not in table.column_names]
        if missing:
            raise ValueError(
                f"{MARK} step '{self.step}': udf '{self.function}' returned columns {table.column_names}; "
                f"missing {missing} of the declared schema"
            )
        try:
            table = table.select(self.schema.names).cast(self.schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise ValueError(f"{MARK} step '{self.step}': udf '{self.function}': result does not fit the schema: {e}") from e
        return table.combine_chunks().to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([], schema=self.schema)


def task_error_line(error: BaseException) -> str | None:
    """The ``eddyline:`` line inside a Spark task failure, if there is one."""
    for line in str(error).splitlines():
        if MARK in line:
            return line[line.index(MARK) + len(MARK) :].strip()
    return None
