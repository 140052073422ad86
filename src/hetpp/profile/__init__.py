"""Layer profiles: measured tables, interpolation in micro-batch size, and the estimator."""
