-- Nexmark q7: highest bid — the bids with the top price of a 10 s tumbling window.
-- The nexmark project's Flink SQL (nexmark-flink/src/main/resources/queries/q7.sql), as written
-- there, with Eddyline's column names (date_time for `dateTime`, item_name for itemName, ...) and
-- the sources declared here instead of in ddl_gen.sql + ddl_views.sql.
-- Run: eddyline sql examples/nexmark/sql/q7.sql --checkpoint ckpt/ --epochs 5
-- Compiled as it reads: B1, the highest price per window with the window's end as its time, is
-- a window_aggregate, joined to the bids by an interval join on price = maxprice. B.date_time
-- BETWEEN B1.date_time - 10 s AND B1.date_time is B1.date_time BETWEEN B.date_time AND
-- B.date_time + 10 s: each bid is an interval (its end computed by a select before the join)
-- and each window's maximum a point at the window's end, when it comes out of its window
-- aggregate. BETWEEN includes both ends, so a bid exactly at a window's end also meets the
-- previous window's maximum: this is q7_topn.sql (Flink's Window Top-N form) and ../q7.yaml,
-- plus such bids when their price is that maximum.
SET 'pipeline.name' = 'nexmark-q7';

CREATE TABLE bid (
  auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR,
  date_time TIMESTAMP(3), extra VARCHAR,
  WATERMARK FOR date_time AS date_time
) WITH ('connector' = 'nexmark', 'stream' = 'bid', 'rate' = '100000');

CREATE TABLE out (auction BIGINT, price BIGINT, bidder BIGINT, date_time TIMESTAMP(3), extra VARCHAR)
WITH ('connector' = 'filesystem', 'path' = 'out/nexmark/q7');

INSERT INTO out
SELECT B.auction, B.price, B.bidder, B.date_time, B.extra
from bid B
JOIN (
  SELECT MAX(price) AS maxprice, window_end as date_time
  FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '10' SECOND))
  GROUP BY window_start, window_end
) B1
ON B.price = B1.maxprice
WHERE B.date_time BETWEEN B1.date_time  - INTERVAL '10' SECOND AND B1.date_time;
