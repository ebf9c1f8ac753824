-- Event-time temporal enrichment (Flink's FOR SYSTEM_TIME AS OF), written in SQL: each order is
-- converted with the rate that was valid at its order time, whatever order the rates and the
-- orders arrived in. The rates table is updated in place (MERGE) and says since when each rate is
-- valid (valid_from). The same job as YAML would read as docs/job-spec.md shows.

CREATE STREAM orders WITH (path='demo/orders', time='order_time');
CREATE TABLE currency_rates WITH (
  path='demo/currency_rates',
  key='currency',
  time='valid_from'                     -- version time: when the rate starts to apply
);

CREATE STREAM orders_rates WITH (
  path='demo/out/orders_rates',
  key='order_id',
  description='orders with the currency rate valid when each order was placed',
  quality_match_column='rate',          -- checked on every backfill slice: NULL when no rate was valid
  quality_min_match_rate=0.95,          -- the rates table holds every currency from the start of the day
  quality_not_null=['order_id', 'currency', 'amount'],
  schedule_every='1d',                  -- Airflow catches up from start (docs/airflow.md)
  schedule_start='2024-05-01'           -- the demo's day
) AS
SELECT
  orders.order_id,
  orders.currency,
  orders.amount,
  currency_rates.rate,
  round(orders.amount * currency_rates.rate, 2) AS amount_eur
FROM orders
LEFT JOIN currency_rates FOR SYSTEM_TIME AS OF orders.order_time
  GRACE PERIOD 1 HOUR                   -- rates may arrive up to an hour behind the newest one
  ON orders.currency = currency_rates.currency;
