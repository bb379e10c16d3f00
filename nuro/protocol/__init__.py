"""The contracts between the platform's parts: job comment, per-job record, preempt marks, heartbeats, GPU
claims, node settings, and the job<->platform constants."""
