"""DDIM on 32x32 digits or 64x64 Oxford Flowers (keras-io example, seed article 002).

The Workload record (data, evaluation, pictures) is added when the workload is registered.
"""
