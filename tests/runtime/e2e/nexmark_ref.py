"""The Nexmark queries' specs and their DuckDB reference results, with rows in a canonical form."""

from __future__ import annotations

from pathlib import Path

import duckdb

SPECS = Path(__file__).resolve().parents[3] / "examples" / "nexmark"


#: The reference: each query in DuckDB SQL over tables person, auction, bid (Flink nexmark's
#: definitions, with DuckDB's functions); event times truncated to ms like Eddyline's windows.
MS = "epoch_us({}) // 1000"  # event times as whole milliseconds, as Eddyline's windows use them


#: query -> (reference over person/auction/bid, the same columns read from Eddyline's output)
REFERENCE: dict[str, tuple[str, str]] = {
    "q0": ("SELECT auction, bidder, price, date_time, extra FROM bid", "SELECT * FROM got"),
    "q1": ("SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid", "SELECT * FROM got"),
    "q2": ("SELECT auction, price FROM bid WHERE auction % 123 = 0", "SELECT * FROM got"),
    "q3": (
        """SELECT P.name, P.city, P.state, A.id FROM auction A JOIN person P ON A.seller = P.id
           WHERE A.category = 10 AND P.state IN ('OR', 'ID', 'CA')""",
        "SELECT * FROM got",
    ),
    "q4": (
        """WITH closing AS (
             SELECT A.id, A.category, max(B.price) AS final FROM auction A JOIN bid B
             ON A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires GROUP BY A.id, A.category)
           SELECT category, round(avg(final), 6) FROM closing GROUP BY category""",
        # a changelog of revisions: summed, one row of weight 1 per category
        """SELECT category, round(average, 6) FROM got GROUP BY category, average HAVING sum(_diff) = 1""",
    ),
    "q5": (
        f"""WITH c AS (SELECT auction, ws, count(*) AS num FROM (
                 SELECT auction, ({MS.format("date_time")} // 2000) * 2000 - i * 2000 AS ws FROM bid, range(5) g(i))
               GROUP BY ALL),
             m AS (SELECT ws, max(num) AS maxn FROM c GROUP BY ws)
           SELECT c.auction, c.num, c.ws, c.ws + 10000 FROM c JOIN m USING (ws) WHERE c.num >= m.maxn""",
        f"SELECT auction, num, {MS.format('window_start')}, {MS.format('window_end')} FROM got",
    ),
    "q6": (
        """WITH closing AS (
             SELECT A.id, A.seller, A.expires, max(B.price) AS final FROM auction A JOIN bid B
             ON A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires GROUP BY ALL)
           SELECT seller, final, expires, round(avg(final) OVER (PARTITION BY seller ORDER BY expires, final
                                                    ROWS BETWEEN 10 PRECEDING AND CURRENT ROW), 6)
           FROM closing""",
        "SELECT seller, final, expires, round(average, 6) FROM got",
    ),
    "q7": (
        f"""WITH w AS (SELECT *, ({MS.format("date_time")} // 10000) * 10000 AS ws FROM bid),
             m AS (SELECT ws, max(price) AS top FROM w GROUP BY ws)
           SELECT auction, price, bidder, date_time, extra FROM w JOIN m USING (ws) WHERE price = top""",
        "SELECT * FROM got",
    ),
    "q8": (
        f"""WITH p AS (SELECT id, name, ({MS.format("date_time")} // 10000) * 10000 AS ws FROM person),
             a AS (SELECT seller, ({MS.format("date_time")} // 10000) * 10000 AS ws FROM auction)
           SELECT DISTINCT p.id, p.name, p.ws FROM p JOIN a ON p.id = a.seller AND p.ws = a.ws""",
        f"SELECT id, name, {MS.format('starttime')} FROM got",
    ),
    "q9": (
        """WITH j AS (SELECT A.*, B.auction, B.bidder, B.price, B.date_time AS bid_date_time,
                      row_number() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.date_time) AS rn
                    FROM auction A JOIN bid B ON A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires)
           SELECT id, item_name, description, initial_bid, reserve, date_time, expires, seller, category,
                  auction, bidder, price, bid_date_time FROM j WHERE rn = 1""",
        "SELECT * FROM got",
    ),
    "q11": (
        f"""WITH b AS (SELECT bidder, {MS.format("date_time")} AS t FROM bid),
             s AS (SELECT bidder, t, CASE WHEN t - lag(t) OVER (PARTITION BY bidder ORDER BY t) < 10000
                                          THEN 0 ELSE 1 END AS new_session FROM b),
             g AS (SELECT bidder, t, sum(new_session) OVER (PARTITION BY bidder ORDER BY t
                                                            ROWS UNBOUNDED PRECEDING) AS sid FROM s)
           SELECT bidder, count(*), min(t), max(t) + 10000 FROM g GROUP BY bidder, sid""",
        f"SELECT bidder, bid_count, {MS.format('session_start')}, {MS.format('session_end')} FROM got",
    ),
}


def canonical(con: duckdb.DuckDBPyConnection, relation: str) -> list[tuple]:
    rows = con.execute(f"SELECT * FROM {relation}").fetchall()
    return sorted(rows, key=lambda r: tuple((x is None, str(x)) for x in r))
