"""Read Delta tables with ``spark.read.format("delta")`` (delta-spark's own reader) in a Spark session of its
own, started with the io.delta jars, and print their rows as JSON. Run as a child process by
tests/sinks/delta/test_readers.py: the test process's shared Spark session has no io.delta jars, and a JVM's
classpath cannot change once it runs. Not a test module.

Usage: python delta_spark_read.py JARS_GLOB TABLE...
"""

from __future__ import annotations

import glob
import json
import os
import sys
from pathlib import Path

os.environ["PYSPARK_PYTHON"] = sys.executable


def main() -> None:
    jars, tables = sys.argv[1], sys.argv[2:]
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.conftest import spark_builder

    spark = (
        spark_builder("delta-spark-reader")
        .config("spark.jars", ",".join(sorted(glob.glob(jars))))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    out = {}
    for table in tables:
        df = spark.read.format("delta").load(table)
        out[table] = {"columns": df.columns, "rows": [r.asDict() for r in df.collect()]}
    print(json.dumps(out, default=str))
    spark.stop()


if __name__ == "__main__":
    main()
