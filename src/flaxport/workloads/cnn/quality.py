"""Classifier quality, shared by both twins: test loss, accuracy, confusion matrix."""
from __future__ import annotations

import numpy as np


def confusion_matrix(labels, preds, num_classes: int) -> np.ndarray:
    """(K, K) int64 counts: row = true class, column = predicted class."""
    cm = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(cm, (np.asarray(labels, np.int64), np.asarray(preds, np.int64)), 1)
    return cm


def summarize(config, val_loss: float, accuracy: float, labels, preds):
    """(quality {'accuracy', 'val_loss'}, artifacts {'confusion': (K, K)})."""
    quality = {"accuracy": round(float(accuracy), 6), "val_loss": round(float(val_loss), 6)}
    return quality, {"confusion": confusion_matrix(labels, preds, config.num_classes)}
