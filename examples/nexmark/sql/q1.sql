-- Nexmark q1: currency conversion, dollars to euros.
-- The nexmark project's Flink SQL (nexmark-flink/src/main/resources/queries/), with Eddyline's
-- column names (date_time for `dateTime`, item_name for itemName, ...) and the sources declared
-- here instead of in ddl_gen.sql + ddl_views.sql.
-- Run: eddyline sql examples/nexmark/sql/q1.sql --checkpoint ckpt/ --epochs 5
SET 'pipeline.name' = 'nexmark-q1';

CREATE TABLE bid (
  auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR,
  date_time TIMESTAMP(3), extra VARCHAR,
  WATERMARK FOR date_time AS date_time
) WITH ('connector' = 'nexmark', 'stream' = 'bid', 'rate' = '100000');

CREATE TABLE out (auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), date_time TIMESTAMP(3), extra VARCHAR)
WITH ('connector' = 'filesystem', 'path' = 'out/nexmark/q1');

INSERT INTO out
SELECT
    auction,
    bidder,
    0.908 * price AS price, -- convert dollar to euro
    date_time,
    extra
FROM bid;
