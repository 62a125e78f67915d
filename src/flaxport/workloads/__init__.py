"""The four workloads, each a folder with the same skeleton (config, model, model_torch,
step, step_torch, convert)."""
