"""Experiment tracking: nuro's runs mirrored into MLflow (issue 18)."""
