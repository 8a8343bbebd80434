"""A DeepSpeed training script written the way DeepSpeed's own examples write
them: ``deepspeed.initialize`` with a JSON config given by ``--deepspeed_config``,
``engine.backward``/``engine.step``, and DeepSpeed's own ``save_checkpoint`` /
``load_checkpoint`` in ``--checkpoint-dir``. Nothing here knows about
torchfleet (the job's command passes the checkpoint directory), so it runs the
same under the ``deepspeed`` launcher (which passes ``--local_rank``) and under
torchrun (which sets ``LOCAL_RANK``).

Each rank prints JSON lines, one write each: ``start`` (where it resumed from and
the parameters' checksum just after loading), ``checkpoint`` (the step saved and
the checksum saved) and ``done`` (the last loss). The data of a step is a pure
function of the step and the rank, so a resumed run sees what an uninterrupted
one would have seen.

``--hold-after-checkpoint N --hold-dir DIR`` (a test's, never a user's): rank 0
holds after its first save at step N or later until the test releases it,
by tests/e2e/hold's files (``held-0`` written, ``release-0`` awaited), once per
job: the other rank waits for it in the next step's collectives, so the test
injects its fault between that checkpoint and the next step on any machine.
"""

import argparse
import json
import os
import sys
import time

import deepspeed
import torch


def report(event: str, **fields: object) -> None:
    # One write per line: the pod's ranks share its log (see ddp_check.py).
    line = json.dumps({"event": event, "rank": int(os.environ.get("RANK", "-1")), **fields})
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def hold(folder: str, step: int) -> None:
    """The test's barrier (see the docstring); a later run finds held-0 and goes on."""
    held, release = os.path.join(folder, "held-0"), os.path.join(folder, "release-0")
    if os.path.exists(held):
        return
    os.makedirs(folder, exist_ok=True)
    with open(held + ".tmp", "w") as out:
        json.dump({"event": "checkpoint", "step": step, "pid": os.getpid()}, out)
    os.replace(held + ".tmp", held)
    while not os.path.exists(release):
        time.sleep(0.05)


def checksum(module: torch.nn.Module) -> float:
    """Stage 2 keeps every parameter whole on every rank: the same number everywhere."""
    return float(sum(p.detach().double().abs().sum() for p in module.parameters()))


def batch(step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    inputs = torch.randn(size, 16, generator=generator)
    target = inputs @ torch.linspace(-1.0, 1.0, 16).unsqueeze(1)
    return inputs, target


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--hold-after-checkpoint", type=int, default=0)
    parser.add_argument("--hold-dir", default="")
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    checkpoint_dir = args.checkpoint_dir

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    # A client optimizer: DeepSpeed's fused Adam needs a GPU (ZeRO then asks
    # for zero_allow_untested_optimizer in the config).
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, optimizer=optimizer)

    loaded, client_state = engine.load_checkpoint(checkpoint_dir)
    first = client_state["step"] + 1 if loaded else 1
    report(
        "start",
        step=first,
        resumed_from=loaded,
        checksum=checksum(engine.module),
        world_size=engine.world_size,
        zero_stage=engine.zero_optimization_stage(),
        backend=torch.distributed.get_backend(),
    )
    loss = torch.tensor(0.0)
    for step in range(first, args.steps + 1):
        inputs, target = batch(step, engine.global_rank, engine.train_micro_batch_size_per_gpu())
        loss = torch.nn.functional.mse_loss(engine(inputs), target)
        engine.backward(loss)
        engine.step()
        if step % args.checkpoint_every == 0 or step == args.steps:
            # Every rank saves: ZeRO-2 writes each rank's optimizer shard.
            engine.save_checkpoint(checkpoint_dir, tag=f"step{step}", client_state={"step": step})
            report("checkpoint", step=step, checksum=checksum(engine.module))
            holds = args.hold_dir and 0 < args.hold_after_checkpoint <= step
            if holds and engine.global_rank == 0:
                hold(args.hold_dir, step)
    report("done", step=args.steps, loss=loss.item())


if __name__ == "__main__":
    main()
