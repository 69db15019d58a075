-- Nexmark q8: monitor new users — people who opened an auction in the 10 s window they joined.
-- q8.sql (nexmark's text groups each side per window, then joins) written as Flink's window
-- join of the two window tables, grouped after, with Eddyline's column names: the same rows.
-- Run: eddyline sql examples/nexmark/sql/q8_window_join.sql --checkpoint ckpt/ --epochs 5
-- A window join of person and auction, then a dedup per (person, window), as ../q8.yaml.
SET 'pipeline.name' = 'nexmark-q8-window-join';

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
SELECT P.id, P.name, P.window_start AS starttime
FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(date_time), INTERVAL '10' SECOND)) P
JOIN TABLE(TUMBLE(TABLE auction, DESCRIPTOR(date_time), INTERVAL '10' SECOND)) A
  ON P.id = A.seller AND P.window_start = A.window_start AND P.window_end = A.window_end
GROUP BY P.id, P.name, P.window_start, P.window_end;
