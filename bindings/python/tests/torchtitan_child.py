"""One training run driven through torchtitan's CheckpointManager with tlio's manager
(a process of test_torchtitan.py): ``child.py FOLDER TOTAL KILL_AFTER OUT``."""

import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
from torchtitan.components.optimizer.optimizer import ParamGroupConfig

from tlio.torchtitan import CheckpointManager


class TrainState:
    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": torch.tensor(self.step)}

    def load_state_dict(self, sd):
        self.step = int(sd["step"])


def main():
    folder, total, kill_after, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{folder}.store")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    opt = OptimizersContainer.Config(param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-2})]).build(model_parts=[model])
    sched = LRSchedulersContainer(opt, lambda s: 1.0 / (1 + s))
    ts = TrainState()
    ckpt = CheckpointManager.Config(enable=True, folder=os.path.basename(folder), interval=1,
                                    keep_latest_k=0, last_save_model_only=False).build(
        dataloader=None, model_parts=[model], optimizers=opt, lr_schedulers=sched,
        states={"train_state": ts}, sd_adapter=None, base_folder=os.path.dirname(folder))
    ckpt.load()
    while ts.step < total:
        ts.step += 1
        g = torch.Generator().manual_seed(ts.step)
        x = torch.randn(4, 8, generator=g)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        ckpt.save(ts.step, last_step=ts.step == total)
        if ts.step == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
    ckpt.close()
    torch.save({k: v.clone() for k, v in model.state_dict().items()} | {"_opt": opt.state_dict()}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
