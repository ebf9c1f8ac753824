"""The streamjoin CLI as the application file of a `spark-submit` (Airflow's SparkSubmitOperator,
dags/streamjoin_dags.py): its arguments are the CLI's, its driver keeps the master and the
settings spark-submit gave it (`session.get_spark`)."""

import sys

from streamjoin.cli import main

sys.exit(main())
