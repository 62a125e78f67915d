"""The seed article's PyTorch CNN (NCHW), generalised only over the config's widths."""
from __future__ import annotations

import torch
from torch import nn

from flaxport.workloads.cnn.model import flat_features


class CNN(nn.Module):
    def __init__(self, config):
        super().__init__()
        c1, c2 = config.conv_widths
        self.conv1 = nn.Conv2d(config.channels, c1, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(c1, eps=config.bn_eps, momentum=config.bn_momentum)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(c2, eps=config.bn_eps, momentum=config.bn_momentum)
        self.fc1 = nn.Linear(flat_features(config), config.hidden)
        self.fc2 = nn.Linear(config.hidden, config.num_classes)

    def forward(self, x):
        """x (N, C, H, W) float -> log-probabilities (N, num_classes)."""
        h = self.conv1(x)
        h = self.bn1(h)
        h = torch.relu(h)
        h = torch.max_pool2d(h, (2, 2))
        h = self.conv2(h)
        h = self.bn2(h)
        h = torch.relu(h)
        h = torch.max_pool2d(h, (2, 2))
        h = h.reshape(len(h), -1)
        h = self.fc1(h)
        h = torch.relu(h)
        h = self.fc2(h)
        return torch.log_softmax(h, -1)
