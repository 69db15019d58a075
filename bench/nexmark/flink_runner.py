"""The Nexmark queries on PyFlink (issue #24): the third engine of ``run_nexmark.py``.

Runs in its own virtualenv (``apache-flink`` pins versions that clash with PySpark's), made by
``run_nexmark.py`` under ``$XDG_CACHE_HOME/eddyline-bench/flink-venv`` (or ``~/.cache/…``). The
Flink SQL is the nexmark project's (``nexmark-flink/src/main/resources/queries/qN.sql``), with
Eddyline's column names, over tables that read the benchmark's CSV or JSON-lines copy of the
data set; where Eddyline's spec differs from that SQL, the query follows Eddyline's spec so that
the rows can be compared (see ``QUERIES`` and ``bench/nexmark/README.md``).

Each job: a ``TableEnvironment`` in streaming mode on the local mini-cluster, parallelism 2, a
``blackhole`` sink (``--sink discard``) or a ``filesystem`` sink of JSON lines (``--sink files``;
``debezium-json`` for the queries whose result is a changelog). Timing: ``wall_s`` is Flink's own
net runtime of the job (from its submission to the cluster to its end: scheduling, deploying the
tasks, reading, computing, writing); ``submit_s`` is what comes before (SQL planning and
optimisation, the job graph, starting the per-job mini-cluster); the JVM starts once per runner
process, before any of it.

Usage, one query (prints one JSON object: ``wall_s``, ``submit_s``, ``events_per_s`` with
``--events``, and with a files sink ``output_rows``, ``final_rows`` and the ``digest``)::

    python flink_runner.py --query q5 --data DIR/csv --format csv --sink files --out OUT \\
        [--warmup DIR/csv/warm] [--watermark-delay 201] [--parallelism 2] [--events 1840000]

or ``--serve``: requests as JSON lines on stdin (the same keys as the options, plus ``tag``),
each answered by one line ``@@flink-result {json}`` on stdout (how ``run_nexmark.py`` keeps one
JVM for the whole benchmark, so a query's warm-up and measured runs share it).

The output digest helpers (:func:`canonical`, :class:`Digest`) import nothing from PyFlink, so
``run_nexmark.py`` uses the same code for Eddyline's and Spark's Parquet output.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
import traceback
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

RESULT_MARK = "@@flink-result "

#: The streams' columns, as ``eddyline.io.nexmark.nexmark_schema`` has them (checked by
#: ``run_nexmark.py`` against that schema before Flink runs).
STREAM_COLUMNS: dict[str, list[tuple[str, str]]] = {
    "person": [
        ("id", "long"),
        ("name", "string"),
        ("email_address", "string"),
        ("credit_card", "string"),
        ("city", "string"),
        ("state", "string"),
        ("date_time", "timestamp"),
        ("extra", "string"),
    ],
    "auction": [
        ("id", "long"),
        ("item_name", "string"),
        ("description", "string"),
        ("initial_bid", "long"),
        ("reserve", "long"),
        ("date_time", "timestamp"),
        ("expires", "timestamp"),
        ("seller", "long"),
        ("category", "long"),
        ("extra", "string"),
    ],
    "bid": [
        ("auction", "long"),
        ("bidder", "long"),
        ("price", "long"),
        ("channel", "string"),
        ("url", "string"),
        ("date_time", "timestamp"),
        ("extra", "string"),
    ],
}

#: Each query's output columns, in Eddyline's order and with Eddyline's names: the columns the
#: digest of every engine's output is taken over.
OUTPUT_COLUMNS: dict[str, list[str]] = {
    "q0": ["auction", "bidder", "price", "date_time", "extra"],
    "q1": ["auction", "bidder", "price", "date_time", "extra"],
    "q2": ["auction", "price"],
    "q3": ["name", "city", "state", "id"],
    "q4": ["category", "average"],
    "q5": ["auction", "num", "window_start", "window_end"],
    "q6": ["seller", "final", "expires", "average"],
    "q7": ["auction", "price", "bidder", "date_time", "extra"],
    "q8": ["id", "name", "starttime"],
    "q9": [
        "id",
        "item_name",
        "description",
        "initial_bid",
        "reserve",
        "date_time",
        "expires",
        "seller",
        "category",
        "auction",
        "bidder",
        "price",
        "bid_date_time",
    ],
    "q11": ["bidder", "bid_count", "session_start", "session_end"],
}

# In the tables below, every timestamp column of the files is read as text (the copies write
# ``2026-01-01T00:00:00.000100Z``, which neither Flink's CSV nor its JSON reader parses as a
# TIMESTAMP) and parsed by a computed column: ``ts`` (``exp_ts`` for ``expires``) to the
# microsecond, for comparisons and output, as Eddyline and Spark have them; ``dt``, the same
# truncated to milliseconds, is the rowtime (Flink's rowtime has at most millisecond precision;
# Eddyline's windows, too, floor event times to milliseconds).

_HOP = "TABLE(HOP(TABLE bid, DESCRIPTOR(dt), INTERVAL '2' SECOND, INTERVAL '10' SECOND))"
_LIFETIME = "A.id = B.auction AND B.ts BETWEEN A.ts AND A.exp_ts"

#: Per query: whether its result is a changelog (updates/retractions: the files sink writes
#: ``debezium-json`` then), and the formulations to try in order, ``(name, SELECT)``.
QUERIES: dict[str, dict[str, Any]] = {
    "q0": {
        "changelog": False,
        "attempts": [("nexmark", "SELECT auction, bidder, price, ts AS date_time, extra FROM bid")],
    },
    "q1": {
        "changelog": False,
        "attempts": [
            (
                "nexmark",
                "SELECT auction, bidder, 0.908 * price AS price, ts AS date_time, extra FROM bid",
            )
        ],
    },
    "q2": {
        "changelog": False,
        "attempts": [("nexmark", "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0")],
    },
    "q3": {
        "changelog": False,
        "attempts": [
            (
                "nexmark",
                "SELECT P.name, P.city, P.state, A.id "
                "FROM auction AS A INNER JOIN person AS P ON A.seller = P.id "
                "WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')",
            )
        ],
    },
    # nexmark's AVG of a BIGINT is a BIGINT in Flink; Eddyline's (and Spark's) avg is a double.
    "q4": {
        "changelog": True,
        "attempts": [
            (
                "nexmark",
                "SELECT Q.category, AVG(CAST(Q.final AS DOUBLE)) AS average FROM ("
                "  SELECT MAX(B.price) AS final, A.category FROM auction A, bid B"
                f"  WHERE {_LIFETIME} GROUP BY A.id, A.category"
                ") Q GROUP BY Q.category",
            )
        ],
    },
    # nexmark's join of the per-window counts with each window's maximum (num >= maxn is the
    # top 1 with ties of Eddyline's spec), keeping the window's start and end as Eddyline does.
    "q5": {
        "changelog": True,
        "attempts": [
            (
                "nexmark",
                "SELECT AuctionBids.auction, AuctionBids.num,"
                "  AuctionBids.starttime AS window_start, AuctionBids.endtime AS window_end FROM ("
                "  SELECT auction, count(*) AS num, window_start AS starttime, window_end AS endtime"
                f"  FROM {_HOP} GROUP BY auction, window_start, window_end"
                ") AS AuctionBids JOIN ("
                "  SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime FROM ("
                "    SELECT count(*) AS num, window_start AS starttime, window_end AS endtime"
                f"    FROM {_HOP} GROUP BY auction, window_start, window_end"
                "  ) AS CountBids GROUP BY CountBids.starttime, CountBids.endtime"
                ") AS MaxBids ON AuctionBids.starttime = MaxBids.starttime"
                "  AND AuctionBids.endtime = MaxBids.endtime AND AuctionBids.num >= MaxBids.maxn",
            )
        ],
    },
    # Eddyline: per closed auction, the average over the seller's last 11 closing prices ordered
    # by closing time (``expires``). nexmark orders by the winning bid's ``dateTime``, which its
    # ``ROW_NUMBER`` subquery leaves ambiguous; here the closing price is nexmark's q4 subquery
    # (``MAX(price)`` per auction) and the order is Eddyline's. Flink 2.3 rejects it: a bounded
    # OVER window must be ordered by a time attribute, and ``expires`` is none. (nexmark's own
    # form passes the planner, ordered by the bid's rowtime, but those are not Eddyline's rows.)
    "q6": {
        "changelog": True,
        "attempts": [
            (
                "nexmark, ordered by closing time",
                "SELECT seller, final, expires, AVG(CAST(final AS DOUBLE)) OVER ("
                "  PARTITION BY seller ORDER BY expires ROWS BETWEEN 10 PRECEDING AND CURRENT ROW"
                ") AS average FROM ("
                "  SELECT A.id, A.seller, A.exp_ts AS expires, MAX(B.price) AS final"
                f"  FROM auction AS A, bid AS B WHERE {_LIFETIME} GROUP BY A.id, A.seller, A.exp_ts"
                ")",
            ),
        ],
    },
    # Eddyline: the bids of each 10 s tumbling window that have its top price (top 1 with ties).
    # nexmark joins the bids with the window maxima on ``dateTime BETWEEN window_end - 10 s AND
    # window_end``, which also takes a bid on a window's end into the window before; here the
    # bid's time is within ``[window_start, window_end)``, Eddyline's windows. (A window Top-N
    # with ``RANK() ... <= 1`` would be Eddyline's query too, but Flink 2.3 takes only
    # ``ROW_NUMBER()`` there, which keeps one of tied bids.)
    "q7": {
        "changelog": False,
        "attempts": [
            (
                "nexmark, bid within its window",
                "SELECT B.auction, B.price, B.bidder, B.ts AS date_time, B.extra FROM bid B JOIN ("
                "  SELECT MAX(price) AS maxprice, window_start, window_end"
                "  FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dt), INTERVAL '10' SECOND))"
                "  GROUP BY window_start, window_end"
                ") B1 ON B.price = B1.maxprice"
                " WHERE B.dt >= B1.window_start AND B.dt < B1.window_end",
            )
        ],
    },
    "q8": {
        "changelog": False,
        "attempts": [
            (
                "nexmark",
                "SELECT P.id, P.name, P.starttime FROM ("
                "  SELECT id, name, window_start AS starttime, window_end AS endtime"
                "  FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(dt), INTERVAL '10' SECOND))"
                "  GROUP BY id, name, window_start, window_end"
                ") P JOIN ("
                "  SELECT seller, window_start AS starttime, window_end AS endtime"
                "  FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(dt), INTERVAL '10' SECOND))"
                "  GROUP BY seller, window_start, window_end"
                ") A ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime",
            )
        ],
    },
    # Eddyline's columns: no ``extra`` of the auction or the bid.
    "q9": {
        "changelog": True,
        "attempts": [
            (
                "nexmark",
                "SELECT id, item_name, description, initial_bid, reserve, date_time, expires,"
                "  seller, category, auction, bidder, price, bid_date_time FROM ("
                "  SELECT A.id, A.item_name, A.description, A.initial_bid, A.reserve,"
                "    A.ts AS date_time, A.exp_ts AS expires, A.seller, A.category,"
                "    B.auction, B.bidder, B.price, B.ts AS bid_date_time,"
                "    ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.ts ASC) AS rownum"
                f"  FROM auction A, bid B WHERE {_LIFETIME}"
                ") WHERE rownum <= 1",
            )
        ],
    },
    "q11": {
        "changelog": False,
        "attempts": [
            (
                "nexmark",
                "SELECT bidder, count(*) AS bid_count,"
                "  SESSION_START(dt, INTERVAL '10' SECOND) AS session_start,"
                "  SESSION_END(dt, INTERVAL '10' SECOND) AS session_end"
                " FROM bid GROUP BY bidder, SESSION(dt, INTERVAL '10' SECOND)",
            )
        ],
    },
}

#: Flink settings of the nexmark project's ``conf/config.yaml`` that concern the SQL planner
#: (its state backend and checkpoints are not used here: no checkpoint is taken).
NEXMARK_TABLE_CONFIG = {
    "table.exec.mini-batch.enabled": "true",
    "table.exec.mini-batch.allow-latency": "2s",
    "table.exec.mini-batch.size": "50000",
    "table.optimizer.distinct-agg.split.enabled": "true",
}


# ----------------------------------------------------------------------------- output digest
_EPOCH = datetime(1970, 1, 1)
_MASK = (1 << 64) - 1


def canonical(value: Any) -> Any:
    """One value as every engine's output is compared: integers as they are; other numbers
    (doubles, decimals) as integers when whole, else to 12 significant digits (sums in another
    order differ in the last bits); timestamps as microseconds since the epoch (UTC)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, (float, Decimal)):
        f = float(value)
        if f.is_integer() and abs(f) < 2**53:
            return int(f)
        return f"{f:.12g}"
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return (value - _EPOCH) // timedelta(microseconds=1)
    return repr(value)


class Digest:
    """An order-independent digest of a multiset of rows: the number of rows and the sum (mod
    2^64) of a hash of each row's canonical values. Rows are added with a weight, so a changelog
    (a retraction is weight -1, Eddyline's ``_diff``) gives the digest of the rows it leaves."""

    def __init__(self) -> None:
        self.rows = 0
        self.sum = 0

    def add(self, values: tuple[Any, ...], weight: int = 1) -> None:
        key = repr(tuple(canonical(v) for v in values)).encode()
        h = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
        self.rows += weight
        self.sum = (self.sum + weight * h) & _MASK

    def as_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "hash": f"{self.sum:016x}"}


def _flink_timestamp(text: str | None) -> datetime | None:
    """Flink's JSON (``SQL`` standard) writes ``2026-01-01 00:00:13.71``; UTC here."""
    return None if text is None else datetime.fromisoformat(text)


def read_flink_output(out: Path, columns: list[str], times: set[str], changelog: bool) -> dict[str, Any]:
    """Digest and record count of a filesystem sink's JSON-lines (or debezium-json) files."""
    digest, records = Digest(), 0
    for path in sorted(p for p in out.rglob("*") if p.is_file() and not p.name.startswith(".")):
        with path.open(encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                records += 1
                doc = json.loads(line, parse_float=Decimal)
                if changelog:
                    changes = []
                    if doc.get("before") is not None:
                        changes.append((doc["before"], -1))
                    if doc.get("after") is not None:
                        changes.append((doc["after"], 1))
                else:
                    changes = [(doc, 1)]
                for row, weight in changes:
                    digest.add(
                        tuple(_flink_timestamp(row[c]) if c in times else row[c] for c in columns),
                        weight,
                    )
    return {"output_rows": records, "final_rows": digest.rows, "digest": digest.as_dict()}


# ----------------------------------------------------------------------------- Flink
def _parse_ts(column: str) -> str:
    return f"CAST(REPLACE(REPLACE(`{column}`, 'T', ' '), 'Z', '') AS TIMESTAMP(6))"


def source_ddl(stream: str, path: str, fmt: str, delay_s: int) -> str:
    """A temporary table over one stream's files (timestamps read as text, see above), with a
    watermark ``delay_s`` behind the rowtime."""
    cols = [
        f"`{name}` {'BIGINT' if kind == 'long' else 'STRING'}"
        for name, kind in STREAM_COLUMNS[stream]
    ]
    cols.append(f"ts AS {_parse_ts('date_time')}")
    if stream == "auction":
        cols.append(f"exp_ts AS {_parse_ts('expires')}")
    cols.append(f"dt AS CAST({_parse_ts('date_time')} AS TIMESTAMP(3))")
    days, rest = divmod(delay_s, 86_400)  # 'S' SECOND(p) takes at most 3 digits in Flink
    hours, rest = divmod(rest, 3600)
    delay = f"'{days} {hours:02d}:{rest // 60:02d}:{rest % 60:02d}' DAY TO SECOND"
    cols.append(f"WATERMARK FOR dt AS dt - INTERVAL {delay}")
    options = {"connector": "filesystem", "path": path, "format": fmt}
    if fmt == "csv":
        options["csv.ignore-parse-errors"] = "false"
    with_ = ", ".join(f"'{k}' = '{v}'" for k, v in options.items())
    return f"CREATE TEMPORARY TABLE `{stream}` (\n  " + ",\n  ".join(cols) + f"\n) WITH ({with_})"


def error_text(e: BaseException) -> str:
    """Flink's message, without the Java stack trace: the deepest ``Caused by`` when the job
    failed at run time, else the exception's first lines."""
    text = str(e).strip()
    lines = [x.strip() for x in text.splitlines() if x.strip() and not x.strip().startswith("at ")]
    causes = [x for x in lines if x.startswith("Caused by:")]
    if causes:
        return causes[-1][len("Caused by:") :].strip()
    return " ".join(lines[:3])


def flink_version() -> str:
    from pyflink.version import __version__

    return __version__


def run_job(
    query: str,
    data: str,
    fmt: str,
    sink: str,
    out: str | None,
    parallelism: int = 2,
    watermark_delay_s: int = 0,
    only: int | None = None,
) -> dict[str, Any]:
    """One query over one data directory (``person/``, ``auction/``, ``bid/``): the first
    formulation Flink accepts (or only formulation ``only``), with every error."""
    from pyflink.table import EnvironmentSettings, TableDescriptor, TableEnvironment

    if query not in QUERIES:
        return {"engine": "pyflink", "tried": [], "error": f"no Flink formulation for {query}"}
    spec = QUERIES[query]
    tried: list[dict[str, Any]] = []
    for i, (form, select) in enumerate(spec["attempts"]):
        if only is not None and i != only:
            continue
        changelog = spec["changelog"]
        try:
            env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
            config = env.get_config()
            config.set("parallelism.default", str(parallelism))
            config.set("table.local-time-zone", "UTC")
            for k, v in NEXMARK_TABLE_CONFIG.items():
                config.set(k, v)
            for stream in STREAM_COLUMNS:
                env.execute_sql(
                    source_ddl(stream, str(Path(data) / stream), fmt, watermark_delay_s)
                )
            table = env.sql_query(select)
            names = table.get_schema().get_field_names()
            if names != OUTPUT_COLUMNS[query]:
                raise ValueError(f"{query}: Flink's columns {names} are not {OUTPUT_COLUMNS[query]}")
            types = table.get_schema().get_field_data_types()
            times = {n for n, t in zip(names, types, strict=True) if "Timestamp" in type(t).__name__}
            if sink == "discard":
                target = TableDescriptor.for_connector("blackhole").build()
                sink_name = "blackhole"
            else:
                kind = "debezium-json" if changelog else "json"
                target = (
                    TableDescriptor.for_connector("filesystem")
                    .option("path", str(out))
                    .format(kind)
                    .option(f"{kind}.encode.decimal-as-plain-number", "true")
                    .build()
                )
                sink_name = f"filesystem ({kind})"
            t0 = time.perf_counter()
            result = table.execute_insert(target)
            t1 = time.perf_counter()
            done = result.get_job_client().get_job_execution_result().result()
            t2 = time.perf_counter()
        except Exception as e:  # noqa: BLE001 - Flink's planner and job errors are what we record
            tried.append({"formulation": form, "error": error_text(e)})
            continue
        entry = {
            "engine": "pyflink",
            "attempt": i,
            "formulation": form,
            "sink": sink_name,
            "tried": tried,
            "wall_s": done.get_net_runtime() / 1000,
            "submit_s": t1 - t0,
            "outer_s": t2 - t0,
            "output_rows": None,
            "parallelism": parallelism,
            "watermark_delay_s": watermark_delay_s,
        }
        if sink == "files":
            entry |= read_flink_output(Path(str(out)), names, times, changelog)
        return entry
    return {"engine": "pyflink", "tried": tried, "error": tried[0]["error"] if tried else "no attempt"}


def _request(args: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        res = run_job(
            args["query"],
            args["data"],
            args["format"],
            args["sink"],
            args.get("out"),
            int(args.get("parallelism", 2)),
            int(args.get("watermark_delay_s", 0)),
            args.get("only"),
        )
    except Exception as e:  # noqa: BLE001 - the runner answers every request
        traceback.print_exc(file=sys.stderr)
        res = {"engine": "pyflink", "tried": [], "error": f"runner: {error_text(e)}"}
    if "wall_s" in res and args.get("events"):
        res["events_per_s"] = int(args["events"]) / res["wall_s"]
    res["tag"] = args.get("tag")
    res["request_s"] = time.perf_counter() - t0
    res["flink_version"] = flink_version()
    return res


def serve() -> None:
    """Answer JSON-line requests on stdin until it closes (or ``{"op": "quit"}``)."""
    print(RESULT_MARK + json.dumps({"ready": True, "flink_version": flink_version()}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if req.get("op") == "quit":
            break
        print(RESULT_MARK + json.dumps(_request(req)), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", action="store_true", help="answer JSON-line requests on stdin")
    ap.add_argument("--query")
    ap.add_argument("--data", help="directory with person/, auction/, bid/ in --format")
    ap.add_argument("--format", default="csv", choices=("csv", "json"))
    ap.add_argument("--sink", default="discard", choices=("discard", "files"))
    ap.add_argument("--out", default=None, help="output directory of the files sink")
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument(
        "--watermark-delay",
        type=int,
        default=86_400,
        help="seconds behind the rowtime (default a day; longer than the data set's event-time "
        "span, which run_nexmark.py passes: see the README)",
    )
    ap.add_argument("--warmup", default=None, help="run first on this directory (same JVM)")
    ap.add_argument(
        "--events", type=int, default=None, help="input rows of the query, for events/s"
    )
    args = ap.parse_args()
    if args.serve:
        serve()
        return
    if not args.query or not args.data or (args.sink == "files" and not args.out):
        ap.error("--query and --data are needed (and --out with --sink files)")
    common = {
        "query": args.query,
        "format": args.format,
        "sink": args.sink,
        "parallelism": args.parallelism,
        "watermark_delay_s": args.watermark_delay,
    }
    res: dict[str, Any] = {}
    if args.warmup:
        out = f"{args.out}-warmup" if args.out else None
        res["warmup"] = _request({**common, "data": args.warmup, "out": out, "tag": "warmup"})
        common["only"] = res["warmup"].get("attempt")
    res |= _request(
        {**common, "data": args.data, "out": args.out, "tag": "run", "events": args.events}
    )
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
