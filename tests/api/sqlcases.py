"""The Nexmark queries the SQL front end compiles, their variant forms, and which compile to exactly
their YAML spec's network."""

from __future__ import annotations

import eddyline  # noqa: F401  (registers the kinds)

QUERIES = ["q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8", "q9", "q11"]


#: other forms of a query, beside nexmark's text in qN.sql: file -> the query
VARIANTS = {"q5_topn": "q5", "q7_topn": "q7", "q8_window_join": "q8"}


#: queries whose SQL compiles to exactly the YAML spec's network (up to the steps' names); the
#: others are run on Spark against their YAML spec (tests/runtime/e2e/test_sql_nexmark.py)
SAME_NETWORK = {"q0", "q1", "q2", "q9", "q11"}
