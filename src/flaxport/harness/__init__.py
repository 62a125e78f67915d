"""The Flax training machinery every workload shares."""
