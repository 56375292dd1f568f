"""``tlio ckpt export`` of a torchtitan step saved through ``tlio.torchtitan``'s manager:
the Hugging Face model directory it writes is read by transformers' ``from_pretrained``
as the trained model, tensor for tensor equal to torchtitan's own conversion
(``Llama3StateDictAdapter.to_hf``) and with the torchtitan model's logits."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import transformers  # noqa: E402

import tlio.dcp  # noqa: E402
from _tokens_helpers import tlio as cli  # noqa: E402

HERE = Path(__file__).parent
CHILD = HERE / "torchtitan_export_child.py"
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
sys.path.insert(0, str(HERE))


def hf_config():
    import torchtitan_export_child as c

    return transformers.LlamaConfig(
        vocab_size=c.VOCAB, hidden_size=c.DIM, intermediate_size=c.HIDDEN, num_hidden_layers=c.LAYERS,
        num_attention_heads=c.HEADS, num_key_value_heads=c.KV_HEADS, rms_norm_eps=1e-5, rope_theta=c.THETA,
        max_position_embeddings=4 * c.SEQ, tie_word_embeddings=False, architectures=["LlamaForCausalLM"])


def test_ckpt_export_of_a_torchtitan_step_is_read_by_transformers_with_the_trained_logits(tmp_path):
    (tmp_path / "assets").mkdir()
    hf_config().to_json_file(str(tmp_path / "assets" / "config.json"))
    out = subprocess.run([sys.executable, str(CHILD), str(tmp_path), str(tmp_path / "trained.pt")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    trained = torch.load(tmp_path / "trained.pt")
    step = tmp_path / "ckpt" / "step-2"
    # The step carries the model's config and the export rule beside its DCP state.
    assert json.loads((step / "config.json").read_text())["num_key_value_heads"] == 2
    doc = json.loads(json.loads((step / "shards.json").read_text())["meta"]["dcp"]["metadata"])
    rule = {t["name"]: t for t in doc["hf_export"]["tensors"]}
    assert rule["model.layers.0.self_attn.k_proj.weight"] == {
        "name": "model.layers.0.self_attn.k_proj.weight", "from": "layers.0.attention.qkv_linear.wk.weight",
        "rotary_heads": 2}
    assert set(rule) == set(trained["to_hf"])

    hf_dir = tmp_path / "hf"
    export = cli("ckpt", "export", str(step), "-o", str(hf_dir))
    assert sorted(p.name for p in hf_dir.iterdir()) == ["config.json", "model.safetensors"], export.stderr
    model = transformers.LlamaForCausalLM.from_pretrained(str(hf_dir))
    got = model.state_dict()
    for name, value in trained["to_hf"].items():
        assert torch.equal(got[name], value), name  # bit for bit torchtitan's own conversion
    with torch.no_grad():
        logits = model(trained["tokens"]).logits
    assert logits.shape == trained["logits"].shape
    torch.testing.assert_close(logits, trained["logits"], rtol=0, atol=1e-5)
    # The export is of the trained weights, not the initial ones.
    assert not torch.equal(got["model.norm.weight"], torch.ones_like(got["model.norm.weight"]))


def test_ckpt_export_of_a_dcp_step_without_an_export_rule_is_refused_saying_why(tmp_path):
    state = {"model": {"w": torch.arange(6.0).reshape(2, 3)}}
    dcp.save(state, storage_writer=tlio.dcp.Writer(tmp_path / "run", step=1), no_dist=True)
    out = cli("ckpt", "export", str(tmp_path / "run" / "step-000001"), "-o", str(tmp_path / "hf"), check=False)
    assert out.returncode != 0 and out.stdout == ""
    assert "without a Hugging Face export rule" in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert not (tmp_path / "hf").exists()
