"""What the gradsync.elastic benchmarks (bench/elastic_loop_bench.sh)
train: torchvision's ResNet-18 for 10 classes, SGD with momentum, seeded
alike, and the committed step; each benchmark's train(round) runs its loop
over it."""
import torch
import torchvision

import gradsync.elastic

WARMUP = 2  # steps before the timed ones


class ResNetTrainer(gradsync.elastic.Trainer):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.model = torchvision.models.resnet18(num_classes=10)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01,
                                         momentum=0.9)
        self.step = 0

    def committed_step(self):
        return self.step
