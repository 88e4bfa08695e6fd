"""Every shipped scenario loads and yields feasible layouts."""
