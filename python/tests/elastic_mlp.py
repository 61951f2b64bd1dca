"""The training state the gradsync.elastic test scripts share: an MLP
(8 -> 32 -> 1; with ELASTIC_NORM_DROPOUT=1 a BatchNorm1d after the first
layer and a Dropout before the last), SGD with momentum, and the committed
step; each script's train(round) runs its loop over it. Also the data of
elastic_plan_script.py, which test_elastic.py trains a reference on."""
import os

import torch

import gradsync.elastic


class MlpTrainer(gradsync.elastic.Trainer):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        stateful = os.environ.get("ELASTIC_NORM_DROPOUT") == "1"
        norm = [torch.nn.BatchNorm1d(32)] if stateful else []
        dropout = [torch.nn.Dropout(0.25)] if stateful else []
        self.model = torch.nn.Sequential(
            torch.nn.Linear(8, 32), *norm, torch.nn.ReLU(), *dropout,
            torch.nn.Linear(32, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.02,
                                         momentum=0.9)
        self.step = 0

    def committed_step(self):
        return self.step

    def parameters_list(self):
        """The final parameters, then the buffers (if any), as lists, for
        the tests to compare."""
        tensors = [*self.model.parameters(), *self.model.buffers()]
        return [t.detach().flatten().tolist() for t in tensors]


def plan_data(n):
    """elastic_plan_script.py's `n` samples (X, Y), and the order of epoch
    `e`'s positions: epoch_order(e)."""
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(7))
    y = torch.sin(x.sum(dim=1, keepdim=True))

    def epoch_order(epoch):
        return torch.randperm(
            n, generator=torch.Generator().manual_seed(100 + epoch))
    return x, y, epoch_order
