-- Nexmark q7: highest bid — per 10 s tumbling window, the bids with the window's top price.
-- Flink's Window Top-N form of q7.sql, with Eddyline's column names: per window, the bids with
-- the top price (RANK keeps ties), a top_k over the window table's rows, as ../q7.yaml.
-- Run: eddyline sql examples/nexmark/sql/q7_topn.sql --checkpoint ckpt/ --epochs 5
-- Not quite nexmark's q7: its BETWEEN includes a window's end, so a bid exactly at the end of a
-- window whose top price it equals is in q7.sql's output, not in this one's (each bid is in one
-- window here).
SET 'pipeline.name' = 'nexmark-q7-topn';

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
