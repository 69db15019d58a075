-- Nexmark q5: hot items — the auctions with the most bids in each sliding window.
-- The nexmark project's Flink SQL (nexmark-flink/src/main/resources/queries/q5.sql), as written
-- there, with Eddyline's column names (date_time for `dateTime`, item_name for itemName, ...) and
-- the sources declared here instead of in ddl_gen.sql + ddl_views.sql.
-- Run: eddyline sql examples/nexmark/sql/q5.sql --checkpoint ckpt/ --epochs 5
-- AuctionBids joined with the maximum count of its window (MaxBids) ON the window's bounds AND
-- num >= maxn are the auctions ranked first, with ties, in their window. The compiler checks
-- that CountBids is the same window aggregate as AuctionBids (same table, window, GROUP BY keys
-- and count(*)), then compiles the join to a top_k (k 1, with ties, per window) over that one
-- window aggregate and drops the second copy: window_aggregate → top_k → select, the network of
-- q5_topn.sql and ../q5.yaml, which also output the window's bounds.
SET 'pipeline.name' = 'nexmark-q5';

CREATE TABLE bid (
  auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR,
  date_time TIMESTAMP(3), extra VARCHAR,
  WATERMARK FOR date_time AS date_time
) WITH ('connector' = 'nexmark', 'stream' = 'bid', 'rate' = '100000');

CREATE TABLE out (auction BIGINT, num BIGINT)
WITH ('connector' = 'filesystem', 'path' = 'out/nexmark/q5');

INSERT INTO out
SELECT AuctionBids.auction, AuctionBids.num
 FROM (
   SELECT auction, count(*) AS num, window_start AS starttime, window_end AS endtime
   FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
   GROUP BY auction, window_start, window_end
 ) AS AuctionBids
 JOIN (
   SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime
   FROM (
     SELECT count(*) AS num, window_start AS starttime, window_end AS endtime
     FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
     GROUP BY auction, window_start, window_end
   ) AS CountBids
   GROUP BY CountBids.starttime, CountBids.endtime
 ) AS MaxBids
 ON AuctionBids.starttime = MaxBids.starttime AND AuctionBids.endtime = MaxBids.endtime AND AuctionBids.num >= MaxBids.maxn;
