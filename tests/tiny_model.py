"""A model small enough for optimizer tests, with the parameter kinds the registry routes
(embedding, hidden matrix, norm, head), and a loss on it."""

import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.hidden = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 11, bias=False)

    def forward(self, idx):
        return self.head(self.norm(torch.tanh(self.hidden(self.embed(idx)))))


def tiny_loss(model):
    idx = torch.arange(6).reshape(2, 3)
    return model(idx).logsumexp(-1).mean()
