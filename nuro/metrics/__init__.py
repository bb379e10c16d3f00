"""Metrics: what runs and nodes report (loss, throughput, GPU telemetry), buffered and written to a time-series sink
(InfluxDB through influxdb-client, or the embedded SQLite default), and read back with one query API."""
