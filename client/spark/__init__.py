"""The PySpark data source and the load / verify jobs (needs the ``spark`` extra)."""
