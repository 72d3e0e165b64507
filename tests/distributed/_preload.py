"""What ``tests.distributed.ranks``'s forkserver imports once, beyond torch and ember's training
loop: the modules every rank of a training would import on its own (torch._dynamo, which DDP
loads, ~1.2 s; matplotlib with the Agg backend the run's plot selects, ~0.4 s; ember's
distributed parts), so that a forked rank starts with them."""

import matplotlib

matplotlib.use("Agg")  # what ember.train.history does before it plots
import matplotlib.pyplot  # noqa: E402,F401
import torch._dynamo  # noqa: E402,F401
import torch.nn.parallel  # noqa: E402,F401

import ember.distributed.process_group  # noqa: E402,F401
import ember.distributed.sharded  # noqa: E402,F401
