"""accelerate's FSDP ``SHARDED_STATE_DICT`` checkpoint written through ``tlio.dcp.Writer``.

    torchrun --nproc_per_node 2 examples/accelerate_fsdp.py --out run

accelerate (1.15) saves a sharded FSDP model in ``save_fsdp_model`` (and the optimizer in
``save_fsdp_optimizer``) as ``dcp.save({"model": state_dict}, storage_writer=
FileSystemWriter(out/pytorch_model_fsdp_0))``; it builds that ``FileSystemWriter`` itself
and takes no storage writer from the plugin, the ``Accelerator`` or the caller, so no
configuration line can route it to tlio. What changes is the call: the same state, under
the same keys, given to ``dcp.save`` with tlio's writer::

    dcp.save({"model": get_model_state_dict(model, options=opts)},
             storage_writer=tlio.dcp.Writer(f"{out}/pytorch_model_fsdp_0", step=step))

(``opts`` is accelerate's: ``StateDictOptions(full_state_dict=False)`` for
``SHARDED_STATE_DICT``), and ``dcp.load`` with ``tlio.dcp.Reader`` on the way back. This
script does both for the model and the optimizer, beside accelerate's own
``save_fsdp_model`` / ``save_fsdp_optimizer`` of the same state; then it loads each
checkpoint into a fresh model, accelerate's through ``load_fsdp_model`` /
``load_fsdp_optimizer`` and tlio's through ``tlio.dcp.Reader``, and prints the digests.

The model is sharded with torch's ``fully_shard`` (FSDP2), as accelerate's FSDP2 plugin
would on GPUs: accelerate turns on FSDP only for its GPU-type backends, and this runs on
CPU with gloo. Rank 0 prints ``sha256 saved=<hex> fresh=<hex> accelerate=<hex>
tlio=<hex>``: the trained state, the fresh model's before loading, and each load's.
"""

from __future__ import annotations

import argparse
import hashlib

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import (
    _prepare_sd_options,
    load_fsdp_model,
    load_fsdp_optimizer,
    save_fsdp_model,
    save_fsdp_optimizer,
)
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import tlio.dcp

torch.set_num_threads(1)
MODEL_DIR = "pytorch_model_fsdp_0"  # accelerate's FSDP_MODEL_NAME + "_0"
OPTIM_DIR = "optimizer_0"


def build(seed: int):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(8, 33), torch.nn.GELU(), torch.nn.Linear(33, 8))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in (net[0], net[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    return net, opt


def train(net, opt, steps: int) -> None:
    for i in range(steps):
        x = torch.linspace(-1, 1, 32).reshape(4, 8) * (i + 1)
        loss = net(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def digest(net, opt) -> str:
    """sha256 of the gathered model and optimizer state (a collective)."""
    h = hashlib.sha256()
    msd = get_model_state_dict(net)
    osd = get_optimizer_state_dict(net, opt)
    for k, v in sorted(msd.items()):
        t = v.full_tensor() if isinstance(v, DTensor) else v
        h.update(k.encode() + t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    for k, state in sorted(osd["state"].items()):
        for name, v in sorted(state.items()):
            t = v.full_tensor() if isinstance(v, DTensor) else torch.as_tensor(v)
            h.update(f"{k}.{name}".encode() + t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def tlio_save(plugin, net, opt, out: str, step: int) -> None:
    """What save_fsdp_model and save_fsdp_optimizer write, through tlio's writer."""
    opts = _prepare_sd_options(plugin)
    dcp.save({"model": get_model_state_dict(net, options=opts)},
             storage_writer=tlio.dcp.Writer(f"{out}/{MODEL_DIR}", step=step))
    dcp.save({"optimizer": get_optimizer_state_dict(net, opt, options=opts)},
             storage_writer=tlio.dcp.Writer(f"{out}/{OPTIM_DIR}", step=step))


def tlio_load(plugin, net, opt, out: str) -> None:
    """What load_fsdp_model and load_fsdp_optimizer read, through tlio's reader (each
    directory's newest step that verifies)."""
    opts = _prepare_sd_options(plugin)
    model = {"model": get_model_state_dict(net, options=opts)}
    dcp.load(model, storage_reader=tlio.dcp.Reader(f"{out}/{MODEL_DIR}"))
    set_model_state_dict(net, model["model"], options=opts)
    optim = {"optimizer": get_optimizer_state_dict(net, opt, options=opts)}
    dcp.load(optim, storage_reader=tlio.dcp.Reader(f"{out}/{OPTIM_DIR}"))
    set_optimizer_state_dict(net, opt, optim["optimizer"], options=opts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True)  # initialises the gloo process group torchrun set up
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    net, opt = build(0)
    train(net, opt, args.steps)
    saved = digest(net, opt)
    save_fsdp_model(plugin, accelerator, net, f"{args.out}/accelerate")
    save_fsdp_optimizer(plugin, accelerator, opt, net, f"{args.out}/accelerate")
    tlio_save(plugin, net, opt, f"{args.out}/tlio", args.steps)

    net, opt = build(1)
    train(net, opt, 1)  # optimizer state to overwrite
    fresh = digest(net, opt)
    load_fsdp_model(plugin, accelerator, net, f"{args.out}/accelerate")
    load_fsdp_optimizer(plugin, accelerator, opt, net, f"{args.out}/accelerate")
    via_accelerate = digest(net, opt)
    net, opt = build(1)
    train(net, opt, 1)
    tlio_load(plugin, net, opt, f"{args.out}/tlio")
    via_tlio = digest(net, opt)
    if dist.get_rank() == 0:
        print(f"sha256 saved={saved} fresh={fresh} accelerate={via_accelerate} tlio={via_tlio}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
