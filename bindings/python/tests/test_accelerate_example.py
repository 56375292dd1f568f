"""examples/accelerate_fsdp.py under torchrun (2 ranks, gloo on CPU): accelerate's FSDP2
``SHARDED_STATE_DICT`` state written through ``tlio.dcp.Writer`` loads back through
``tlio.dcp.Reader`` bit for bit as accelerate's own ``save_fsdp_model`` /
``save_fsdp_optimizer`` checkpoint loads through ``load_fsdp_model`` /
``load_fsdp_optimizer``, and the tlio steps verify with the CLI."""

import subprocess

import accelerate  # noqa: F401  (in requirements-test.txt: a missing accelerate fails the run)

from _tokens_helpers import ROOT, tlio as cli
from test_torch_dist import TIMEOUT, _env, _no_core_dumps, torchrun

EXAMPLE = ROOT / "examples" / "accelerate_fsdp.py"


def test_accelerate_sharded_state_saved_through_tlio_loads_as_accelerates_own(tmp_path):
    out = subprocess.run(torchrun(2, str(EXAMPLE), "--out", str(tmp_path)), capture_output=True, text=True,
                         timeout=TIMEOUT, env=_env(), preexec_fn=_no_core_dumps)
    assert out.returncode == 0, out.stderr[-4000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("sha256 "))
    got = dict(kv.split("=") for kv in line.split()[1:])
    assert got["saved"] == got["accelerate"] == got["tlio"], got
    assert got["fresh"] != got["saved"]  # the loads replaced another state
    for part in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert (tmp_path / "accelerate" / part / ".metadata").is_file()
        run = tmp_path / "tlio" / part
        assert (run / "LATEST").read_text() == "step-000002\n"
        assert cli("ckpt", "verify", str(run)).returncode == 0
