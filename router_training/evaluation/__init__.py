"""Measuring routers on outcomes they were not trained on: metrics, baselines, the bench, shifted
test sets."""
