"""The training SDK used inside jobs: Checkpointer, restore_latest, PreemptionGuard."""
