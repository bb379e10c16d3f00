"""Dataset snapshots: immutable, content-addressed manifests of sharded files in S3 (see docs/datasets.md)."""
