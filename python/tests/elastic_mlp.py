"""The training state the gradsync.elastic test scripts share: an MLP
(8 -> 32 -> 1), SGD with momentum, and the committed step; each script's
train(round) runs its loop over it."""
import torch

import gradsync.elastic


class MlpTrainer(gradsync.elastic.Trainer):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.02,
                                         momentum=0.9)
        self.step = 0

    def committed_step(self):
        return self.step

    def parameters_list(self):
        """The final parameters, as lists, for the tests to compare."""
        return [p.detach().flatten().tolist() for p in self.model.parameters()]
