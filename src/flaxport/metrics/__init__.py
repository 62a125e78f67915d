"""Quality metrics shared by workloads (KID); the JSONL/console metric writers are flaxport.harness.metrics."""
