"""What happened to runs and nodes: the platform's event log, a run's own events in S3, and the timeline
assembled from both and Slurm."""
