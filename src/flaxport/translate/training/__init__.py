"""train_step.py and train.py beside a translation: the torch training loop's parts (optimizer,
loss, schedule, parameter groups, clipping, accumulation, precision, devices) read from the
user's texts or torch objects and written out as JAX, each proven against torch."""
