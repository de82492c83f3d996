"""`make bench`: figures, not timed tests (see README "Benchmarks")."""
