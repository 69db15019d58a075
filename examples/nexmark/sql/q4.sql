-- Nexmark q4: average closing price per category.
-- The nexmark project's Flink SQL (nexmark-flink/src/main/resources/queries/), with Eddyline's
-- column names (date_time for `dateTime`, item_name for itemName, ...) and the sources declared
-- here instead of in ddl_gen.sql + ddl_views.sql.
-- Run: eddyline sql examples/nexmark/sql/q4.sql --checkpoint ckpt/ --epochs 5
-- Both GROUP BYs are unbounded aggregates: their output is a changelog of revisions (_diff),
-- like ../q4.yaml's, which finds each auction's closing price with a top-1 instead of MAX.
SET 'pipeline.name' = 'nexmark-q4';

CREATE TABLE auction (
  id BIGINT, item_name VARCHAR, description VARCHAR, initial_bid BIGINT, reserve BIGINT,
  date_time TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, category BIGINT, extra VARCHAR,
  WATERMARK FOR date_time AS date_time
) WITH ('connector' = 'nexmark', 'stream' = 'auction', 'rate' = '100000');

CREATE TABLE bid (
  auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR,
  date_time TIMESTAMP(3), extra VARCHAR,
  WATERMARK FOR date_time AS date_time
) WITH ('connector' = 'nexmark', 'stream' = 'bid', 'rate' = '100000');

CREATE TABLE out (category BIGINT, average DOUBLE)
WITH ('connector' = 'filesystem', 'path' = 'out/nexmark/q4');

INSERT INTO out
SELECT
    Q.category,
    AVG(Q.final)
FROM (
    SELECT MAX(B.price) AS final, A.category
    FROM auction A, bid B
    WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires
    GROUP BY A.id, A.category
) Q
GROUP BY Q.category;
