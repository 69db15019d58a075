-- Nexmark q5: hot items — the auctions with the most bids in each sliding window.
-- q5.sql (nexmark's text: the counts joined with their maximum per window) written as Flink's
-- Window Top-N (RANK keeps the auctions tied for the top count), with Eddyline's column names.
-- Run: eddyline sql examples/nexmark/sql/q5_topn.sql --checkpoint ckpt/ --epochs 5
-- Compiles to what q5.sql does, window_aggregate → top_k → select, and also outputs the
-- window's bounds, as ../q5.yaml.
SET 'pipeline.name' = 'nexmark-q5-topn';

CREATE TABLE bid (
  auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR,
  date_time TIMESTAMP(3), extra VARCHAR,
  WATERMARK FOR date_time AS date_time
) WITH ('connector' = 'nexmark', 'stream' = 'bid', 'rate' = '100000');

CREATE TABLE out (auction BIGINT, num BIGINT, window_start TIMESTAMP(3), window_end TIMESTAMP(3))
WITH ('connector' = 'filesystem', 'path' = 'out/nexmark/q5');

INSERT INTO out
SELECT auction, num, window_start, window_end
FROM (
    SELECT *, RANK() OVER (PARTITION BY window_start, window_end ORDER BY num DESC) AS rk
    FROM (
        SELECT auction, count(*) AS num, window_start, window_end
        FROM TABLE(
            HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
        GROUP BY auction, window_start, window_end
    )
)
WHERE rk <= 1;
