-- Nexmark q9: winning bids — each auction with its highest bid (earliest among equal prices)
-- within its lifetime, emitted when the auction expires.
-- The nexmark project's Flink SQL (nexmark-flink/src/main/resources/queries/), with Eddyline's
-- column names (date_time for `dateTime`, item_name for itemName, ...) and the sources declared
-- here instead of in ddl_gen.sql + ddl_views.sql.
-- Run: eddyline sql examples/nexmark/sql/q9.sql --checkpoint ckpt/ --epochs 5
-- The output leaves out the two extra columns, as ../q9.yaml does.
SET 'pipeline.name' = 'nexmark-q9';

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

CREATE TABLE out (
  id BIGINT, item_name VARCHAR, description VARCHAR, initial_bid BIGINT, reserve BIGINT,
  date_time TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, category BIGINT,
  auction BIGINT, bidder BIGINT, price BIGINT, bid_date_time TIMESTAMP(3)
) WITH ('connector' = 'filesystem', 'path' = 'out/nexmark/q9');

INSERT INTO out
SELECT
    id, item_name, description, initial_bid, reserve, date_time, expires, seller, category,
    auction, bidder, price, bid_date_time
FROM (
   SELECT A.*, B.auction, B.bidder, B.price, B.date_time AS bid_date_time,
     ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.date_time ASC) AS rownum
   FROM auction A, bid B
   WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires
)
WHERE rownum <= 1;
