"""The seeds' join statements verbatim (../shared/seeds/), with declarations of their sources:
test_sql.py compiles them to the jobs the YAML tests use, and the seed tests run them."""

# Flink's declarations as its seed writes them, the connector's WITH (...) options replaced by the
# table's path: `orders`, with a watermark and no primary key, is its append-only table (a stream).
FLINK_SOURCES = """
CREATE TABLE orders (
    order_id    STRING,
    price       DECIMAL(32,2),
    currency    STRING,
    order_time  TIMESTAMP(3),
    WATERMARK FOR order_time AS order_time - INTERVAL '15' SECOND
) WITH (path='{orders}');
CREATE TABLE currency_rates (
    currency STRING,
    conversion_rate DECIMAL(32, 2),
    update_time TIMESTAMP(3) METADATA FROM `values.source.timestamp` VIRTUAL,
    WATERMARK FOR update_time AS update_time - INTERVAL '15' SECOND,
    PRIMARY KEY(currency) NOT ENFORCED
) WITH (path='{rates}'{changelog});
"""
FLINK_TEMPORAL = """SELECT
     order_id,
     price,
     orders.currency,
     conversion_rate,
     order_time
FROM orders
LEFT JOIN currency_rates FOR SYSTEM_TIME AS OF orders.order_time
ON orders.currency = currency_rates.currency;"""

RISINGWAVE_SOURCES = """
CREATE STREAM stock_prices WITH (path='{prices}', time='stock_time');
CREATE TABLE market_data WITH (path='{market}', key=['stock_name', 'market_time'], clock_skew='0s');
"""
RISINGWAVE_ASOF = """SELECT sp.stock_name, sp.stock_time, sp.price, md.sentiment
FROM stock_prices sp
ASOF JOIN market_data md
ON sp.stock_name = md.stock_name
AND md.market_time <= sp.stock_time;"""

# ksqlDB's N-way join with C a stream. ksqlDB gives a join's grace only in the statement (its
# default, 24 hours, would close no window in a test), so C's declaration holds it, as Flink
# declares it: a 2 s WATERMARK delay, the grace of the join that takes C.
KSQLDB_NWAY_SOURCES = """
CREATE STREAM A WITH (path='{A}', time='t');
CREATE TABLE B WITH (path='{B}', key='product_id', changelog=true, clock_skew='1h');
CREATE STREAM C (purchased_id INT, carrier STRING, t TIMESTAMP, WATERMARK FOR t AS t - INTERVAL '2' SECOND)
  WITH (path='{C}');
"""
KSQLDB_NWAY_STREAM = """  SELECT *
  FROM A
    JOIN B ON A.id = B.product_id
    JOIN C WITHIN 10 SECONDS ON A.id = C.purchased_id;"""

# Lenses: a view per source (what it is read as) and INSERT INTO the output; the output and the
# sources the views read are declared.
LENSES_SOURCES = """
CREATE TABLE customers WITH (path='{customers}', key='id', clock_skew='0s');
CREATE STREAM orders WITH (path='{orders}', time='t');
CREATE STREAM result WITH (path='{output}');
"""
# Lenses' "Matching expression (ON)": two queries it calls equivalent; the _key facet is a column
# here, each source's declared key.
LENSES_KEYED_SOURCES = """
CREATE TABLE customers WITH (path='customers', key='_key');
CREATE TABLE orders WITH (path='orders', key='_key');
CREATE TABLE target WITH (path='target');
"""
LENSES_DEFAULT_KEY = """SELECT TABLE *
FROM customers JOIN orders;"""
LENSES_ON_KEY = """SELECT TABLE *
FROM customers JOIN orders
    ON customers._key = orders._key;"""
LENSES_VIEWS = """WITH customersTable AS (SELECT TABLE * FROM customers);
WITH ordersStream AS (SELECT STREAM * FROM orders);

"""  # the views each of Lenses' join examples opens with
LENSES_INNER = (
    LENSES_VIEWS
    + """INSERT INTO result
SELECT STREAM
    customersTable.name
   , ordersStream.item
 FROM
    ordersStream JOIN customersTable
        ON customersTable.id = ordersStream.customer_id;"""
)
LENSES_LEFT = (
    LENSES_VIEWS
    + """INSERT INTO result
SELECT STREAM
    customersTable.name
    , ordersStream.item
 FROM
    ordersStream LEFT JOIN customersTable
        ON customersTable.id = ordersStream.customer_id;"""
)
LENSES_RIGHT = (
    LENSES_VIEWS
    + """INSERT INTO result
SELECT TABLE
    customersTable.name
    , ordersStream.item
 FROM
    customersTable RIGHT JOIN ordersStream
        ON customersTable.id = ordersStream.customer_id;"""
)

# More of the seeds' join statements as printed (the outputs of ksqlDB's and RisingWave's have no
# WITH: a folder named after them), each with declarations of its sources.
KSQLDB_SHIPPED_ORDERS = """
CREATE STREAM orders WITH (path='orders', time='ts');
CREATE STREAM payments WITH (path='payments', time='ts');
CREATE STREAM shipments WITH (path='shipments', time='ts');
   CREATE STREAM shipped_orders AS
     SELECT
        o.id as orderId,
        o.itemid as itemId,
        s.id as shipmentId,
        p.id as paymentId
     FROM orders o
        INNER JOIN payments p WITHIN 1 HOURS ON p.id = o.id
        INNER JOIN shipments s WITHIN 2 HOURS ON s.id = o.id;"""
KSQLDB_TABLES = """
CREATE STREAM A WITH (path='A', time='ts');
CREATE TABLE B WITH (path='B', key='product_id');
CREATE TABLE C WITH (path='C', key='purchased_id');
CREATE STREAM joined AS
  SELECT *
  FROM A
    JOIN B ON A.id = B.product_id
    JOIN C ON A.id = C.purchased_id;"""
KSQLDB_FULL_OUTER_STAGE = """
CREATE STREAM A WITH (path='A', time='ts');
CREATE STREAM B WITH (path='B', time='ts');
CREATE TABLE C WITH (path='C', key='purchased_id');
--- This JOIN fails with the following exception:
--- Join between invalid operands requested: left type: KTABLE, right type: KSTREAM
CREATE STREAM joined AS
  SELECT *
  FROM A
    JOIN B WITHIN 10 SECONDS ON A.id = B.product_id
    FULL OUTER JOIN C ON A.id = C.purchased_id;"""
FLINK_ORDERS_PRODUCT = """
CREATE STREAM Orders WITH (path='orders', time='order_time');
CREATE TABLE Product WITH (path='product', key='id');
CREATE STREAM joined WITH (path='out') AS
SELECT *
FROM Orders
{join} Product
ON Orders.product_id = Product.id"""
# SQLstream's three-way join, verbatim: bids joined with itself through asks. SQLstream's
# streams arrive in rowtime order and need no grace; the test's are out of order by up to five
# minutes between the two streams, which their watermarks declare (the joins' grace).
SQLSTREAM_QUOTE_SOURCES = """
CREATE STREAM bids (ticker STRING, n INT, t TIMESTAMP, WATERMARK FOR t AS t - INTERVAL '5' MINUTE) WITH (path='{bids}');
CREATE STREAM asks (ticker STRING, n INT, t TIMESTAMP, WATERMARK FOR t AS t - INTERVAL '5' MINUTE) WITH (path='{asks}');
"""
SQLSTREAM_THREE_WAY = """SELECT STREAM * from bids over (range interval '1' hour preceding) as b1
join asks over (range interval '2' second preceding)
on b1."ticker" = asks."ticker"
join bids over (range interval '3' minute preceding) as b2
on b2."ticker" = asks."ticker";"""

# SQLstream's stocks example, its LEFT JOIN as printed: its streams declared with the test's
# out-of-order arrivals (up to 10 s between the two streams) as their watermark delay.
SQLSTREAM_STOCKS_SOURCES = """
CREATE STREAM order_quantity (rowtime TIMESTAMP, WATERMARK FOR rowtime AS rowtime - INTERVAL '10' SECOND)
  WITH (path='{oq}');
CREATE STREAM stock_price (rowtime TIMESTAMP, WATERMARK FOR rowtime AS rowtime - INTERVAL '10' SECOND)
  WITH (path='{sp}');
"""
SQLSTREAM_LEFT = """SELECT STREAM rowtime, sp.ticker, oq.quantity, sp.ending_price
  FROM order_quantity OVER (RANGE INTERVAL '1' MINUTE PRECEDING) as oq
    LEFT JOIN stock_price OVER (RANGE INTERVAL '1' MINUTE PRECEDING) AS sp
    ON (oq.ticker = sp.ticker);"""

# RisingWave's process-time temporal join, verbatim: bare column names, the plan names their
# sources from the schemas. Its comma form (the EXPLAIN example's shape) with the same tables.
RISINGWAVE_SALES_SOURCES = """
CREATE STREAM sales WITH (path='{sales}', time='process_time');
CREATE TABLE products WITH (path='{products}', key='id', clock_skew='0s');
"""
RISINGWAVE_PROCTIME = """SELECT transaction_id, product_id, quantity, sale_date, product_name, price
FROM sales
JOIN products FOR SYSTEM_TIME AS OF PROCTIME()
ON product_id = id;"""
RISINGWAVE_PROCTIME_COMMA = """select transaction_id, product_id, quantity, sale_date, product_name, price
from sales, products FOR SYSTEM_TIME AS OF PROCTIME() where product_id = id;"""

# RisingWave's sources (CREATE SOURCE: append-only, a stream) as it declares them, with a path for
# the connector's options.
RISINGWAVE_INTERVAL = """
CREATE SOURCE s1 (id int, value int, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '20' SECOND) WITH (path='s1');
CREATE SOURCE s2 (id int, value int, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '20' SECOND) WITH (path='s2');
CREATE MATERIALIZED VIEW interval_join AS
SELECT s1.id AS id1,
s1.value AS value1,
s2.id AS id2,
s2.value AS value2
FROM s1 JOIN s2
ON s1.id = s2.id and s1.ts between s2.ts and s2.ts + INTERVAL '1 minute';"""

# RisingWave's window join (003): its sources as declared above; the statement as printed.
RISINGWAVE_WINDOW = """
CREATE SOURCE s1 (id int, value int, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '20' SECOND) WITH (path='s1');
CREATE SOURCE s2 (id int, value int, ts TIMESTAMP, WATERMARK FOR ts AS ts - INTERVAL '20' SECOND) WITH (path='s2');
CREATE MATERIALIZED VIEW window_join AS
SELECT s1.id AS id1,
s1.value AS value1,
s2.id AS id2,
s2.value AS value2
FROM TUMBLE(s1, ts, interval '1' MINUTE)
JOIN TUMBLE(s2, ts, interval '1' MINUTE)
ON s1.id = s2.id and s1.window_start = s2.window_start;"""

# Flink's lookup join (004): Customers is the seed's JDBC table (its url pointing at the test's
# PostgreSQL); the stream of orders is declared as a Delta stream.
FLINK_LOOKUP_SOURCES = """
CREATE STREAM Orders WITH (path='{orders}', time='t');
CREATE TEMPORARY TABLE Customers (
  id INT,
  name STRING,
  country STRING,
  zip STRING
) WITH (
  'connector' = 'jdbc',
  'url' = '{url}',
  'table-name' = 'customers'
);
"""
FLINK_LOOKUP = """SELECT o.order_id, o.total, c.country, c.zip
FROM Orders AS o
  JOIN Customers FOR SYSTEM_TIME AS OF o.proc_time AS c
    ON o.customer_id = c.id;"""
