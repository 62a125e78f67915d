"""torch.optim optimizers as optax chains: the transformations optax lacks (transforms.py) and
each optimizer's chain (chains.py), built for check_step and written into train_step.py."""
