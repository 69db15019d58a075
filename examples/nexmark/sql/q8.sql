-- Nexmark q8: monitor new users — people who opened an auction in the 10 s window they joined.
-- The nexmark project's Flink SQL (nexmark-flink/src/main/resources/queries/q8.sql), as written
-- there, with Eddyline's column names (date_time for `dateTime`, item_name for itemName, ...) and
-- the sources declared here instead of in ddl_gen.sql + ddl_views.sql.
-- Run: eddyline sql examples/nexmark/sql/q8.sql --checkpoint ckpt/ --epochs 5
-- Each side is a GROUP BY without aggregates per tumbling window (a dedup: one row per key and
-- window); the two are joined on id = seller and equal window bounds, which is a window join
-- on each side's window start (a row at its window's start lies in that window). The same
-- rows as q8_window_join.sql (Flink's window join) and ../q8.yaml, which join first and group
-- after.
SET 'pipeline.name' = 'nexmark-q8';

CREATE TABLE person (
  id BIGINT, name VARCHAR, email_address VARCHAR, credit_card VARCHAR, city VARCHAR, state VARCHAR,
  date_time TIMESTAMP(3), extra VARCHAR,
  WATERMARK FOR date_time AS date_time
) WITH ('connector' = 'nexmark', 'stream' = 'person', 'rate' = '100000');

CREATE TABLE auction (
  id BIGINT, item_name VARCHAR, description VARCHAR, initial_bid BIGINT, reserve BIGINT,
  date_time TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, category BIGINT, extra VARCHAR,
  WATERMARK FOR date_time AS date_time
) WITH ('connector' = 'nexmark', 'stream' = 'auction', 'rate' = '100000');

CREATE TABLE out (id BIGINT, name VARCHAR, starttime TIMESTAMP(3))
WITH ('connector' = 'filesystem', 'path' = 'out/nexmark/q8');

INSERT INTO out
SELECT P.id, P.name, P.starttime
FROM (
  SELECT id, name, window_start AS starttime, window_end AS endtime
  FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(date_time), INTERVAL '10' SECOND))
  GROUP BY id, name, window_start, window_end
) P
JOIN (
  SELECT seller, window_start AS starttime, window_end AS endtime
  FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(date_time), INTERVAL '10' SECOND))
  GROUP BY seller, window_start, window_end
) A
ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime;
