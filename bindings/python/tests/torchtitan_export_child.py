"""A tiny torchtitan llama3 trained and saved through tlio's torchtitan manager (a process
of test_torchtitan_export.py): ``torchtitan_export_child.py BASE OUT``.

BASE/assets/config.json is the Hugging Face config of the same model (the test writes it
with transformers), named by the state dict adapter's ``hf_assets_path`` as in a
torchtitan run. The model takes two AdamW steps of a loss on its parameters (torch's flex
attention, torchtitan's attention here, has no backward on CPU) and is saved as step 2;
OUT gets its logits on fixed tokens (a no-grad forward with a causal block mask) and
torchtitan's own Hugging Face conversion of its state (``to_hf``)."""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.attention.flex_attention import create_block_mask
from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
from torchtitan.components.optimizer.optimizer import ParamGroupConfig
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.llama3 import (
    _EMBEDDING_INIT,
    _NORM_INIT,
    Llama3Model,
    Llama3StateDictAdapter,
    _build_llama3_layers,
    _output_linear_init,
)

from tlio.torchtitan import CheckpointManager

DIM, HEADS, KV_HEADS, VOCAB, HIDDEN, LAYERS, SEQ = 64, 4, 2, 128, 128, 2, 16
THETA = 10000.0


def model_config() -> Llama3Model.Config:
    return Llama3Model.Config(
        dim=DIM, vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=DIM, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=_output_linear_init(DIM)),
        layers=_build_llama3_layers(fuse_qkv=True, n_layers=LAYERS, dim=DIM, n_heads=HEADS, n_kv_heads=KV_HEADS,
                                    hidden_dim=HIDDEN, attn_backend="flex",
                                    rope=ComplexRoPE.Config(dim=DIM // HEADS, max_seq_len=4 * SEQ, theta=THETA)))


def tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(5))


def main():
    base, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{base}/store")
    torch.manual_seed(0)
    cfg = model_config()
    model = cfg.build()
    model.init_weights()
    opt = OptimizersContainer.Config(param_groups=[ParamGroupConfig(
        pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-2})]).build(model_parts=[model])
    sched = LRSchedulersContainer(opt, lambda s: 1.0)
    adapter = Llama3StateDictAdapter(cfg, os.path.join(base, "assets"))
    ckpt = CheckpointManager.Config(enable=True, folder="ckpt", interval=1, keep_latest_k=0,
                                    last_save_model_only=False).build(
        dataloader=None, model_parts=[model], optimizers=opt, lr_schedulers=sched, states={},
        sd_adapter=adapter, base_folder=base)
    g = torch.Generator().manual_seed(1)
    targets = {n: torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
    for step in (1, 2):
        loss = sum(((p - targets[n]) ** 2).mean() for n, p in model.named_parameters())
        opt.zero_grad()
        loss.backward()
        opt.step()
        ckpt.save(step, last_step=step == 2)
    ckpt.close()
    mask = create_block_mask(lambda b, h, q, k: q >= k, None, None, SEQ, SEQ, device="cpu")
    with torch.no_grad():
        logits = model(tokens(), attention_masks=mask)
        hf = {k: v.clone() for k, v in adapter.to_hf(model.state_dict()).items()}
    torch.save({"logits": logits, "tokens": tokens(), "to_hf": hf}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
