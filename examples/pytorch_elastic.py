"""Elastic training, written against Horovod's elastic API (the import line is the only change): the
digits MLP keeps its model, optimizer and place in the epoch in a TorchState and commits every 10
batches. Under an elastic rrun the job goes on when a rank or host fails (from the last commit, on
the ranks left) and grows when the discovery script reports more slots:

    rrun -np 2 --min-np 1 --max-np 4 --host-discovery-script examples/discover_hosts.sh \\
        python examples/pytorch_elastic.py

(examples/discover_hosts.sh prints this machine with 2 slots, or the lines of the file $HOSTS: edit
that file while the job runs to see it resize.) On one workstation, kill a rank's process (`kill -9`)
after the first epoch: rrun names it, sees that its host still answers, and starts the ranks there
again from the last commit; a rank that fails at every start gets its host set aside after
--tries-per-host tries (2), and the job ends at once, saying why. Under a plain `rrun -np 2` it
trains as any job.
"""

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import ringreduce.torch as hvd  # was: import horovod.torch as hvd

BATCH, EPOCHS, LR = 32, 8, 0.05

hvd.init()
torch.set_num_threads(1)
digits = load_digits()
x, y = torch.tensor(digits.data, dtype=torch.float32) / 16.0, torch.tensor(digits.target)
train_x, test_x, train_y, test_y = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
dataset = torch.utils.data.TensorDataset(train_x, train_y)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=LR * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)
loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler, drop_last=True)


def scale_learning_rate():
    """After a resize: the learning rate follows the number of ranks, as at the start."""
    for group in optimizer.param_groups:
        group["lr"] = LR * hvd.size()


@hvd.elastic.run
def train(state):
    for epoch in range(state.epoch, EPOCHS):
        state.epoch = epoch
        for batch_idx, (inputs, labels) in enumerate(loader):
            optimizer.zero_grad()
            F.cross_entropy(model(inputs), labels).backward()
            optimizer.step()
            state.sampler.record_batch(batch_idx, BATCH)
            if batch_idx % 10 == 9:
                state.commit()
        with torch.no_grad():
            accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}: test accuracy {accuracy:.3f} on {hvd.size()} ranks", flush=True)
        state.sampler.set_epoch(epoch + 1)
        state.epoch = epoch + 1
        state.commit()


state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)
state.register_reset_callbacks([scale_learning_rate])
train(state)
