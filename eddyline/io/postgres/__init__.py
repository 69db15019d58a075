"""The ``postgres`` sink: each epoch's rows land in a PostgreSQL table exactly once.

``mode: append`` copies every row in; ``mode: upsert`` writes by ``key``, and applies an input
that carries revisions (``_diff``, docs/revisions.md) as a changelog by key. Beside the target
table, in its schema, the sink keeps bookkeeping tables: ``eddyline_epochs`` (which epochs were
written, the ground of exactly once), ``eddyline_fence`` (under a lease) and ``eddyline_undo``
(for tentative epochs and replays). By role:

- :mod:`.sink`: the sink, one transaction per epoch; :mod:`.kind`: its registration;
  :mod:`.params`: its fields and connection options.
- :mod:`.layout`: the columns and key, from the input's schema; :mod:`.schema`: the tables
  made or checked when the sink opens.
- :mod:`.rows`: an epoch's rows as actions by key; :mod:`.statements`: the SQL that writes them.
- :mod:`.fence`: the lease generation checked inside every writing transaction.
- :mod:`.journal`: the undo records that take epochs back and put them back.
"""

from eddyline.io.postgres.kind import PostgresKind
from eddyline.io.postgres.params import Postgres
from eddyline.io.postgres.sink import PostgresSink

__all__ = ["Postgres", "PostgresKind", "PostgresSink"]
