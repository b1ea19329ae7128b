"""Human-readable output: tables for the terminal, reports for runs and sweeps."""
