-- Nexmark q7: highest bid — per 10 s tumbling window, the bids with the window's top price.
-- The nexmark project's Flink SQL (nexmark-flink/src/main/resources/queries/), with Eddyline's
-- column names (date_time for `dateTime`, item_name for itemName, ...) and the sources declared
-- here instead of in ddl_gen.sql + ddl_views.sql.
-- Run: eddyline sql examples/nexmark/sql/q7.sql --checkpoint ckpt/ --epochs 5
-- nexmark's q7 joins the bids with their window's maximum price; this is the same result written
-- as Flink's Window Top-N over the window table (RANK keeps the bids tied for the top price).
SET 'pipeline.name' = 'nexmark-q7';

CREATE TABLE bid (
  auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR,
  date_time TIMESTAMP(3), extra VARCHAR,
  WATERMARK FOR date_time AS date_time
) WITH ('connector' = 'nexmark', 'stream' = 'bid', 'rate' = '100000');

CREATE TABLE out (auction BIGINT, price BIGINT, bidder BIGINT, date_time TIMESTAMP(3), extra VARCHAR)
WITH ('connector' = 'filesystem', 'path' = 'out/nexmark/q7');

INSERT INTO out
SELECT auction, price, bidder, date_time, extra
FROM (
    SELECT *, RANK() OVER (PARTITION BY window_start, window_end ORDER BY price DESC) AS rk
    FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '10' SECOND))
)
WHERE rk <= 1;
