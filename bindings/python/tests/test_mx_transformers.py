"""`tlio st dequantize` of a gpt-oss-layout MXFP4 directory against transformers' own MXFP4
path: a tiny GptOss model whose experts are MXFP4 (made by torchao's `to_mx`), loaded by
transformers with `Mxfp4Config(dequantize=True)`, must give the same weights and logits, bit
for bit, as tlio's dequantized directory loaded plainly, in F32 and in BF16."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from _tokens_helpers import tlio

transformers = pytest.importorskip(
    "transformers", reason="transformers (a test-only requirement) is not installed"
)
mx_tensor = pytest.importorskip(
    "torchao.prototype.mx_formats.mx_tensor",
    reason="torchao (a test-only requirement) is not installed",
)

HIDDEN = 64
INTER = 96  # not HIDDEN: a transposition mistake changes a shape
EXPERTS = 4
# Where gpt-oss keeps its float weights (its own checkpoints list these).
NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def tiny_config():
    return transformers.GptOssConfig(
        vocab_size=96,
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        num_local_experts=EXPERTS,
        num_experts_per_tok=2,
        sliding_window=8,
        max_position_embeddings=64,
    )


def mxfp4_pair(w: "torch.Tensor"):
    """torchao's MXFP4 of a transformers expert weight `[E, in, out]`, in gpt-oss's layout:
    `_blocks` U8 `[E, out, in/32, 16]` and `_scales` U8 `[E, out, in/32]`."""
    rows = w.transpose(1, 2).contiguous()  # [E, out, in]: blocks run along `in`
    scale, data = mx_tensor.to_mx(rows, torch.float4_e2m1fn_x2, 32)
    e, out, inn = rows.shape
    blocks = data.view(torch.uint8).reshape(e, out, inn // 32, 16).contiguous()
    scales = scale.view(torch.uint8).reshape(e, out, inn // 32).contiguous()
    return blocks, scales


@pytest.fixture(scope="module")
def mxfp4_dir(tmp_path_factory):
    """A gpt-oss MXFP4 directory as OpenAI ships it: experts as `_blocks`/`_scales`, the
    rest float, `quantization_config` in config.json and no `quant` in the shard."""
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("mx")
    plain = root / "plain"
    transformers.GptOssForCausalLM(tiny_config()).save_pretrained(plain)
    state = load_file(plain / "model.safetensors")
    out = {}
    for name, t in state.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            # Larger than the init's so the scales spread over several exponents.
            blocks, scales = mxfp4_pair(t * 8)
            out[name + "_blocks"] = blocks
            out[name + "_scales"] = scales
        else:
            out[name] = t
    d = root / "mxfp4"
    d.mkdir()
    # Two shards and an index, as gpt-oss ships: layer 0 in the first, the rest after.
    shards = {"model-00001-of-00002.safetensors": {}, "model-00002-of-00002.safetensors": {}}
    names = list(shards)
    for name, t in out.items():
        shards[names[0] if ".layers.0." in name else names[1]][name] = t
    weight_map = {}
    for shard, tensors in shards.items():
        save_file(tensors, d / shard, metadata={"format": "pt"})
        weight_map.update({name: shard for name in tensors})
    total = sum(t.numel() * t.element_size() for t in out.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    config = json.loads((plain / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": NOT_CONVERTED}
    (d / "config.json").write_text(json.dumps(config))
    shutil.copy(plain / "generation_config.json", d / "generation_config.json")
    return d


def ref_names(d: Path):
    """The tensor names of the unquantized model: each MXFP4 pair is one weight."""
    index = json.loads((d / "model.safetensors.index.json").read_text())
    names = set()
    for name in index["weight_map"]:
        names.add(name.removesuffix("_blocks").removesuffix("_scales"))
    return names


def bits(t: "torch.Tensor") -> "torch.Tensor":
    """The tensor's bit patterns, so equality is bit for bit (NaN and -0 included)."""
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def transformers_dequantized(d: Path, dtype):
    q = transformers.Mxfp4Config(dequantize=True)
    return transformers.GptOssForCausalLM.from_pretrained(d, quantization_config=q, dtype=dtype).eval()


@pytest.mark.parametrize("flag,dtype", [("f32", "float32"), ("bf16", "bfloat16")])
def test_st_dequantize_of_gpt_oss_mxfp4_loads_as_transformers_dequantizes_it(mxfp4_dir, tmp_path, flag, dtype):
    dtype = getattr(torch, dtype)
    out = tmp_path / "dequantized"
    tlio("st", "dequantize", str(mxfp4_dir), "-o", str(out), "--dtype", flag)
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert sorted(index["weight_map"]) == sorted(ref_names(mxfp4_dir))
    assert sorted(p.name for p in out.glob("*.safetensors")) == sorted(set(index["weight_map"].values()))

    ref = transformers_dequantized(mxfp4_dir, dtype)
    mine = transformers.GptOssForCausalLM.from_pretrained(out, dtype=dtype).eval()
    assert getattr(mine.config, "quantization_config", None) is None
    ref_state, my_state = ref.state_dict(), mine.state_dict()
    assert sorted(ref_state) == sorted(my_state)
    experts = [k for k in ref_state if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert len(experts) == 4
    for k, v in ref_state.items():
        got = my_state[k]
        assert got.dtype == v.dtype == dtype, k
        assert got.shape == v.shape, k
        assert torch.equal(bits(got), bits(v)), k

    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = ref(input_ids=ids).logits
        b = mine(input_ids=ids).logits
    assert a.dtype == b.dtype == dtype
    assert torch.equal(bits(a), bits(b))
