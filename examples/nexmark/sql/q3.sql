-- Nexmark q3: local item suggestion — sellers in OR/ID/CA with auctions in category 10.
-- The nexmark project's Flink SQL (nexmark-flink/src/main/resources/queries/), with Eddyline's
-- column names (date_time for `dateTime`, item_name for itemName, ...) and the sources declared
-- here instead of in ddl_gen.sql + ddl_views.sql.
-- Run: eddyline sql examples/nexmark/sql/q3.sql --checkpoint ckpt/ --epochs 5
-- The conditions on one table run before the join (filters on auction and on person); the join
-- is unbounded: give it SET 'table.exec.state.ttl' = '1h' in production.
SET 'pipeline.name' = 'nexmark-q3';

CREATE TABLE auction (
  id BIGINT, item_name VARCHAR, description VARCHAR, initial_bid BIGINT, reserve BIGINT,
  date_time TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, category BIGINT, extra VARCHAR,
  WATERMARK FOR date_time AS date_time
) WITH ('connector' = 'nexmark', 'stream' = 'auction', 'rate' = '100000');

CREATE TABLE person (
  id BIGINT, name VARCHAR, email_address VARCHAR, credit_card VARCHAR, city VARCHAR, state VARCHAR,
  date_time TIMESTAMP(3), extra VARCHAR,
  WATERMARK FOR date_time AS date_time
) WITH ('connector' = 'nexmark', 'stream' = 'person', 'rate' = '100000');

CREATE TABLE out (name VARCHAR, city VARCHAR, state VARCHAR, id BIGINT)
WITH ('connector' = 'filesystem', 'path' = 'out/nexmark/q3');

INSERT INTO out
SELECT
    P.name, P.city, P.state, A.id
FROM
    auction AS A INNER JOIN person AS P ON A.seller = P.id
WHERE
    A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA');
