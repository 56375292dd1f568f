"""``dcp.load`` through ``tlio.dcp.Reader`` gives the tensors a ``FileSystemWriter`` /
``FileSystemReader`` round trip of the same state gives, bit for bit, at more layouts
than test_dcp.py's 2-rank FSDP2 (gloo on CPU): FSDP2 at 4 ranks, FSDP x TP on a 2x2 mesh,
tensor parallel at 2 ranks, optimizer state and DCP's bytes items included, at the same
layout and resharded (FSDP2 -> FSDP x TP at 4 ranks; 4 ranks -> 2: FSDP2 -> FSDP2,
FSDP2 -> TP, FSDP x TP -> TP and FSDP2)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch  # noqa: F401  (in requirements-test.txt: a missing torch fails the run)

from test_torch_dist import TIMEOUT, _env, _no_core_dumps, torchrun

HERE = Path(__file__).parent
CHILD = HERE / "_dcp_child.py"
sys.path.insert(0, str(HERE))
import _dcp_child as child  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def run_ranks(tmp: Path, nproc: int, mode: str, *args: str) -> dict:
    """The child under torchrun with ``nproc`` ranks: {rank: its report}."""
    report = tmp / f"report-{mode}-{time.monotonic_ns()}"
    out = subprocess.run(torchrun(nproc, str(CHILD), mode, str(report), *args), capture_output=True, text=True,
                         timeout=TIMEOUT, env=_env(), preexec_fn=_no_core_dumps)
    assert out.returncode == 0, out.stderr[-4000:]
    return {r: json.loads(Path(f"{report}.{r}").read_text()) for r in range(nproc)}


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """Each layout's state saved by 4 ranks both ways, loaded back (4 ranks), and the
    4-rank steps loaded by 2 ranks."""
    tmp = tmp_path_factory.mktemp("layouts")
    four = run_ranks(tmp, 4, "layouts4", str(tmp))
    two = run_ranks(tmp, 2, "reshard2", str(tmp))
    return four, two


def expected(saved: dict) -> dict:
    return {"digests": saved, "extra": child.EXTRA}


def test_every_rank_reports_the_same_gathered_state(layouts):
    four, two = layouts
    assert all(four[r] == four[0] for r in four)
    assert all(two[r] == two[0] for r in two)


@pytest.mark.parametrize("name, at", [("fsdp4", 4), ("fsdp_tp4", 4), ("tp2", 2)])
def test_state_loads_through_tlio_as_through_filesystem_reader_at_its_layout(layouts, name, at):
    four, two = layouts
    rep = (four if at == 4 else two)[0][name]
    # Optimizer state is part of what is compared (AdamW's moments of every parameter).
    assert any(k.startswith("opt/") and k.endswith(".exp_avg_sq") for k in rep["saved"])
    assert rep["same"]["fs"] == rep["same"]["tlio"] == expected(rep["saved"])


@pytest.mark.parametrize("source, name", [("fsdp4", "fsdp4_to_fsdp2"), ("fsdp4", "fsdp4_to_tp2"),
                                          ("fsdp_tp4", "fsdp_tp4_to_tp2"), ("fsdp_tp4", "fsdp_tp4_to_fsdp2")])
def test_four_rank_state_reshards_to_two_ranks_as_with_filesystem_reader(layouts, source, name):
    four, two = layouts
    got = two[0][name]
    assert got["fs"] == got["tlio"] == expected(four[0][source]["saved"])


def test_fsdp2_state_of_four_ranks_loads_into_fsdp_x_tp_as_with_filesystem_reader(layouts):
    four, _ = layouts
    got = four[0]["fsdp4_to_fsdp_tp4"]
    assert got["fs"] == got["tlio"] == expected(four[0]["fsdp4"]["saved"])
