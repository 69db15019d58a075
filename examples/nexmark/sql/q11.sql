-- Nexmark q11: user sessions — bids per bidder per session (a 10 s gap closes a session).
-- The nexmark project's Flink SQL (nexmark-flink/src/main/resources/queries/), with Eddyline's
-- column names (date_time for `dateTime`, item_name for itemName, ...) and the sources declared
-- here instead of in ddl_gen.sql + ddl_views.sql.
-- Run: eddyline sql examples/nexmark/sql/q11.sql --checkpoint ckpt/ --epochs 5
SET 'pipeline.name' = 'nexmark-q11';

CREATE TABLE bid (
  auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR,
  date_time TIMESTAMP(3), extra VARCHAR,
  WATERMARK FOR date_time AS date_time
) WITH ('connector' = 'nexmark', 'stream' = 'bid', 'rate' = '100000');

CREATE TABLE out (bidder BIGINT, bid_count BIGINT, session_start TIMESTAMP(3), session_end TIMESTAMP(3))
WITH ('connector' = 'filesystem', 'path' = 'out/nexmark/q11');

INSERT INTO out
SELECT
    B.bidder,
    count(*) AS bid_count,
    SESSION_START(B.date_time, INTERVAL '10' SECOND) AS session_start,
    SESSION_END(B.date_time, INTERVAL '10' SECOND) AS session_end
FROM bid B
GROUP BY B.bidder, SESSION(B.date_time, INTERVAL '10' SECOND);
