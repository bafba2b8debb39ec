"""A course-style script, tiny: the rank read from SLURM_PROCID (srun) or RANK (torchrun) as the courses read
it, gloo, a few DDP steps on a 16->4 linear model, every step recorded and checkpointed through trainscale.

    --steps N            train N steps (resumes from the newest checkpoint in --checkpoints)
    --fail-on NODE       the first rank on node NODE (SLURMD_NODENAME) raises at --fail-at
    --hold-at K          on the job's first attempt, after checkpointing step K, wait for the preemption
                         signal (up to 10 min) so that the test can send it while the job surely runs
"""

import argparse
import os
import sys
import time

import torch
from torch import nn

import trainscale
from trainscale.checkpoint import Checkpointer
from trainscale.observe.records import RankRecorder

RANK = int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0")))  # the course's way
NODE = os.environ.get("SLURMD_NODENAME", "")


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 16, generator=g)
    return x, x[:, :4].sum(1, keepdim=True).repeat(1, 4)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--checkpoints", required=True)
    p.add_argument("--fail-on", default="")
    p.add_argument("--fail-at", type=int, default=3)
    p.add_argument("--hold-at", type=int, default=-1)
    a = p.parse_args()
    torch.set_num_threads(1)
    with trainscale.init(seed=0, device="cpu") as rt:
        assert rt.rank == RANK, f"SLURM_PROCID/RANK says {RANK}, trainscale {rt.rank}"
        model, opt = rt.setup(nn.Linear(16, 4), lambda params: torch.optim.SGD(params, lr=0.05), strategy="ddp")
        ckpt = Checkpointer(a.checkpoints, rt)
        state = {"model": rt.checkpoint_state(model, opt), "step": 0}
        found = ckpt.restore(state)
        start = found.contents["step"] if found is not None else 0
        rt.print(
            f"rank {RANK} of {rt.world_size} on {NODE}: {'resumed at step ' + str(start) if found else 'fresh'}, "
            f"attempt {rt.attempt + 1}"
        )
        rec = RankRecorder(
            rt.env.run_dir, rt.rank, flush_every=1, world_size=rt.world_size
        )  # every step: a rank may die
        pre = rt.handle_preemption()
        for step in range(start, a.steps):
            t0 = time.perf_counter()
            if a.fail_on and NODE == a.fail_on and rt.local_rank == 0 and step == a.fail_at:
                raise RuntimeError(f"injected failure of rank {rt.rank} on {NODE} at step {step}")
            x, y = batch(step, rt.rank)
            t1 = time.perf_counter()
            loss = nn.functional.mse_loss(model(x), y)
            t2 = time.perf_counter()
            rt.backward(loss)
            opt.step()
            opt.zero_grad()
            rec.step(step + 1, time.perf_counter() - t0, data_s=t1 - t0, compute_s=t2 - t1, samples=8)
            state["step"] = step + 1
            ckpt.save(step + 1, state)
            if step + 1 == a.hold_at and rt.attempt == 0:
                for _ in range(6000):  # counted, not timed: every rank leaves after the same all-reduce
                    if pre.requested():  # TRAINSCALE_PREEMPT_CHECK_EVERY=1: agreed across ranks at every call
                        break
                    time.sleep(0.1)
            if pre.requested():
                rec.close()
                pre.requeue_and_log(
                    f"Preempted ({pre.received or 'signal on another rank'}) at step {step + 1}", rt.print
                )
                return
        rec.summary(steps=a.steps)
        rec.close()
        rt.print(f"finished {a.steps} steps, loss {rt.mean(loss):.6f}")


if __name__ == "__main__":
    main()
    sys.exit(0)
