"""Checkpoints: manifests, node-local staging, background upload to S3, restore of the newest valid one."""
