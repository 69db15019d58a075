-- Nexmark q6: average selling price by seller, over each seller's last 10 closed auctions.
-- The nexmark project's Flink SQL (nexmark-flink/src/main/resources/queries/), with Eddyline's
-- column names (date_time for `dateTime`, item_name for itemName, ...) and the sources declared
-- here instead of in ddl_gen.sql + ddl_views.sql.
-- Run: eddyline sql examples/nexmark/sql/q6.sql --checkpoint ckpt/ --epochs 5
-- nexmark's q6 does not run on Flink as written (it orders by the bid's time, which the top-1
-- per auction does not keep, and filters rownum where it is defined); as ../q6.yaml, this takes
-- each auction's top bid within its lifetime and orders a seller's auctions by closing time.
SET 'pipeline.name' = 'nexmark-q6';

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

CREATE TABLE out (seller BIGINT, final BIGINT, expires TIMESTAMP(3), average DOUBLE)
WITH ('connector' = 'filesystem', 'path' = 'out/nexmark/q6');

INSERT INTO out
SELECT
    seller, final, expires,
    AVG(final) OVER (PARTITION BY seller ORDER BY expires ROWS BETWEEN 10 PRECEDING AND CURRENT ROW) AS average
FROM (
    SELECT seller, price AS final, expires
    FROM (
        SELECT A.id, A.seller, A.expires, B.price,
               ROW_NUMBER() OVER (PARTITION BY A.id, A.seller ORDER BY B.price DESC) AS rownum
        FROM auction AS A, bid AS B
        WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires
    )
    WHERE rownum <= 1
);
