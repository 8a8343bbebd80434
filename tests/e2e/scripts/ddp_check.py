"""A plain PyTorch DDP script, written the way PyTorch's own tutorials write
them: the process group comes from the environment torchrun sets (env://), and
nothing here knows about torchfleet. Each rank prints one JSON line."""

import json
import os
import socket
import sys

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    world_size = dist.get_world_size()

    # Every rank contributes rank + 1, so the sum is known: n(n+1)/2.
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value, op=dist.ReduceOp.SUM)

    # A tiny DDP step too, to show gradients are averaged across the gang.
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1, bias=False))
    model(torch.tensor([[float(rank + 1)]])).sum().backward()
    grad = model.module.weight.grad.item()

    report = {
        "rank": rank,
        "world_size": world_size,
        "env": {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")},
        "all_reduce_sum": value.item(),
        "ddp_grad": grad,
        "host": socket.gethostname(),
    }
    # One write per line: the pod's ranks share its log, and with an unbuffered
    # stdout (the image sets PYTHONUNBUFFERED) print() writes the text and its
    # newline apart, so two ranks' lines could run together.
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
