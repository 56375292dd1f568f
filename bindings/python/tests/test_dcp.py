"""tlio as the storage of PyTorch DCP (scale.md section 7): ``dcp.save`` / ``dcp.load``
through ``tlio.dcp.Writer`` / ``Reader`` give the state a ``FileSystemWriter`` /
``FileSystemReader`` round trip gives, bit for bit, in one process and under torchrun
(2 ranks FSDP2, gloo on CPU), at the same layout and resharded to one plain process,
optimizer state included; what lands on disk is a tlio sharded step with no pickle."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch  # in requirements-test.txt: a missing torch fails the run, never skips it
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from safetensors import safe_open

import tlio.dcp
import tlio.sharded
from _tokens_helpers import tlio as cli
from test_torch_dist import TIMEOUT, _env, _no_core_dumps, torchrun

HERE = Path(__file__).parent
CHILD = HERE / "_dcp_child.py"
sys.path.insert(0, str(HERE))
import _dcp_child as child  # noqa: E402
import _torch_shard_child as shard  # noqa: E402

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def run_ranks(tmp: Path, mode: str, *args: str) -> dict:
    """The child under torchrun with 2 ranks: {rank: its report}."""
    report = tmp / f"report-{mode}-{time.monotonic_ns()}"
    out = subprocess.run(torchrun(2, str(CHILD), mode, str(report), *args), capture_output=True, text=True,
                         timeout=TIMEOUT, env=_env(), preexec_fn=_no_core_dumps)
    assert out.returncode == 0, out.stderr[-4000:]
    return {r: json.loads(Path(f"{report}.{r}").read_text()) for r in (0, 1)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Steps 1 and 2 of an FSDP2 state saved by 2 ranks, by FileSystemWriter and tlio."""
    tmp = tmp_path_factory.mktemp("dcp")
    return tmp, run_ranks(tmp, "save", str(tmp))


def plain_load(**kw) -> dict:
    """dcp.load in one process (no torch.distributed) into a plain net and AdamW."""
    net, opt = child.fresh()
    extra = child.load_into(net, opt, no_dist=True, **kw)
    return {"digests": shard.digests(net, opt), "extra": extra}


def test_one_process_save_and_load_equal_filesystem_writer_round_trip(tmp_path):
    net, opt = child.plain_net(0)
    shard.train(net, opt, 2)
    sd = child.state(net, opt)
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(tmp_path / "fs"), no_dist=True)
    writer = tlio.dcp.Writer(tmp_path / "run", step=5)
    dcp.save(sd, storage_writer=writer, no_dist=True)
    assert writer.committed == str(tmp_path / "run" / "step-000005")
    saved = shard.digests(net, opt)
    via_fs = plain_load(storage_reader=dcp.FileSystemReader(tmp_path / "fs"))
    via_tlio = plain_load(storage_reader=tlio.dcp.Reader(tmp_path / "run"))
    assert via_fs == via_tlio == {"digests": saved, "extra": child.EXTRA}
    assert (tmp_path / "run" / "LATEST").read_text() == "step-000005\n"


def test_a_tlio_step_is_a_sharded_step_of_safetensors_and_json_with_no_pickle(saved):
    tmp, _ = saved
    step = tmp / "run" / "step-000001"
    names = sorted(os.listdir(step))
    assert names == ["MANIFEST.json", "dcp-rank00000.safetensors", "dcp-rank00001.safetensors",
                     "shards.json", "trainer_state.json"]
    manifest = json.loads((step / "MANIFEST.json").read_text())
    assert [f["name"] for f in manifest["files"]] == names[1:]
    table = json.loads((step / "shards.json").read_text())
    assert table["format"] == "tlio-shards" and table["digest"] == "blake3"
    tensors = {t["name"]: t for t in table["tensors"]}
    assert {t["group"] for t in table["tensors"]} == {"dcp"}
    # A tensor FSDP2 sharded over 2 ranks: two chunks in two files, each with digests.
    up = tensors["model.up.weight"]
    assert [c["file"] for c in up["chunks"]] == ["dcp-rank00000.safetensors", "dcp-rank00001.safetensors"]
    assert all(c["pieces"] for c in up["chunks"])
    # DCP's bytes items (the plain values) are U8 vectors, opaque to tlio.
    assert tensors["extra.epoch"]["dtype"] == "U8"
    doc = json.loads(table["meta"]["dcp"]["metadata"])
    assert "extra.epoch" in doc["bytes"] and "model.up.weight" in doc["tensors"]
    # Every data file is read by the safetensors package; nothing is a pickle.
    for name in names:
        data = (step / name).read_bytes()
        assert not data.startswith(b"\x80"), name
        if name.endswith(".safetensors"):
            with safe_open(str(step / name), "np") as f:
                assert list(f.keys())
    opened = tlio.sharded.open_step(str(tmp / "run"), 1)
    assert opened.sharded and ("dcp", "model.up.weight") in opened.tensors()
    opened.close()


def test_fsdp2_state_of_two_ranks_loads_as_with_filesystem_writer_at_the_same_layout(saved):
    tmp, ranks = saved
    for r in (0, 1):
        rep = ranks[r]
        assert rep["saved1"] == ranks[0]["saved1"]
        expected = {"digests": rep["saved1"], "extra": child.EXTRA}
        # tlio's Reader gives what DCP's own reader gives, which is what was saved.
        assert rep["fs"] == rep["tlio"] == rep["titan"] == expected, r
        assert rep["latest"] == {"digests": rep["saved2"], "extra": {**child.EXTRA, "epoch": 4}}
        assert rep["latest_path"] == str(tmp / "run" / "step-000002")
    assert ranks[0]["committed"] == str(tmp / "run" / "step-000001")
    assert (tmp / "run" / "LATEST").read_text() == "step-000002\n"
    # checkpoint_id names the step directory, as with FileSystemWriter.
    assert (tmp / "titan" / "step-1" / "MANIFEST.json").is_file()
    assert not (tmp / "ignored").exists()


def test_fsdp2_state_of_two_ranks_reshards_into_one_plain_process_as_with_filesystem_writer(saved):
    tmp, ranks = saved
    expected = {"digests": ranks[0]["saved1"], "extra": child.EXTRA}
    via_fs = plain_load(storage_reader=dcp.FileSystemReader(tmp / "fs" / "step-1"))
    assert via_fs == expected
    assert plain_load(storage_reader=tlio.dcp.Reader(tmp / "run", step=1)) == expected
    assert plain_load(storage_reader=tlio.dcp.Reader(tmp / "titan" / "step-1")) == expected
    assert plain_load(storage_reader=tlio.dcp.Reader(tmp / "anything"), checkpoint_id=tmp / "titan" / "step-1") == expected


def test_the_cli_verifies_and_inspects_a_tlio_step_written_through_dcp(saved):
    tmp, _ = saved
    out = cli("ckpt", "verify", str(tmp / "run"), "--json")
    assert out.returncode == 0, out.stderr
    latest = cli("ckpt", "latest", str(tmp / "run"))
    assert latest.stdout.strip() == str(tmp / "run" / "step-000002")
    inspect = cli("st", "inspect", str(tmp / "run" / "step-000002"))
    assert inspect.returncode == 0 and "model.up.weight" in inspect.stdout, inspect.stderr


# Damage, side by side: the same byte of the same tensor flipped, the same rank's file
# truncated or deleted, in a FileSystemWriter step and in a tlio step of one state.

TENSOR = "model.up.weight"


def _fs_span(step: Path) -> tuple:
    """(file, offset, length) of rank 1's chunk of TENSOR in a FileSystemWriter step."""
    md = dcp.FileSystemReader(step).read_metadata()
    for index, info in md.storage_data.items():
        if index.fqn == TENSOR and list(index.offset)[0] > 0:
            return info.relative_path, info.offset, info.length
    raise AssertionError("no rank-1 chunk")


def _tlio_span(step: Path) -> tuple:
    table = json.loads((step / "shards.json").read_text())
    t = next(t for t in table["tensors"] if t["name"] == TENSOR)
    c = t["chunks"][1]
    return c["file"], c["begin"], c["end"] - c["begin"]


def _damage(step: Path, span: tuple, how: str) -> str:
    name, offset, length = span
    path = step / name
    if how == "flip":
        with open(path, "r+b") as f:
            f.seek(offset + length // 2)
            b = f.read(1)
            f.seek(offset + length // 2)
            f.write(bytes([b[0] ^ 0x01]))
    elif how == "truncate":
        os.truncate(path, offset + length // 2)
    else:
        path.unlink()
    return name


def _outcome(fn) -> tuple:
    try:
        return ("loaded", fn())
    except (Exception, CheckpointException) as e:  # DCP's is a BaseException
        return ("raised", f"{type(e).__name__}: {e}")


@pytest.mark.parametrize("how", ["flip", "truncate", "delete"])
def test_damage_that_dcp_misses_or_misreports_tlio_refuses_naming_file_and_chunk(saved, tmp_path, how):
    tmp, ranks = saved
    expected = {"digests": ranks[0]["saved1"], "extra": child.EXTRA}
    fs = tmp_path / "fs"
    shutil.copytree(tmp / "fs" / "step-1", fs)
    fs_file = _damage(fs, _fs_span(fs), how)
    fs_result = _outcome(lambda: plain_load(storage_reader=dcp.FileSystemReader(fs)))
    run = tmp_path / "run"
    shutil.copytree(tmp / "run", run)
    step = run / "step-000002"
    tlio_file = _damage(step, _tlio_span(step), how)
    tlio_result = _outcome(lambda: plain_load(storage_reader=tlio.dcp.Reader(step)))
    # What DCP's own reader does with the same damage (torch 2.15, recorded in docs/python.md).
    if how == "flip":
        assert fs_result[0] == "loaded" and fs_result[1] != expected, fs_result  # garbage, silently
        assert fs_result[1]["extra"] == child.EXTRA
    elif how == "truncate":
        assert fs_result[0] == "raised" and fs_file not in fs_result[1], fs_result
    else:
        assert fs_result[0] == "raised" and fs_file in fs_result[1], fs_result
    # tlio refuses, naming the file, and for damaged bytes the tensor and the chunk.
    assert tlio_result[0] == "raised", tlio_result
    assert tlio_file in tlio_result[1], tlio_result
    if how == "flip":
        table = json.loads((step / "shards.json").read_text())
        chunk = next(t for t in table["tensors"] if t["name"] == TENSOR)["chunks"][1]
        assert f"{TENSOR} " in tlio_result[1] and f"offsets {chunk['offsets']}" in tlio_result[1], tlio_result
    # The run directory falls back to the newest step that verifies and says why.
    reader = tlio.dcp.Reader(run)
    with pytest.warns(UserWarning, match="step-000002"):
        assert plain_load(storage_reader=reader) == expected
    assert reader.path == str(run / "step-000001")
    assert [name for name, _ in reader.skipped] == ["step-000002"]
    assert tlio_file in reader.skipped[0][1], reader.skipped
    assert tlio.dcp.latest(run) == str(run / "step-000001")


def test_a_rank_failing_in_write_data_commits_nothing_and_a_second_writer_of_a_step_is_refused(tmp_path):
    ranks = run_ranks(tmp_path, "faults", str(tmp_path))
    for r in (0, 1):
        rep = ranks[r]
        # Rank 1's error is raised on both ranks; nothing of the step is left behind.
        assert rep["failed"][0] == "CheckpointException", rep["failed"]
        assert "rank 1's disk is gone" in rep["failed"][1]
        assert "step-000001" not in rep["after_failure"] and "LATEST" not in rep["after_failure"]
        assert rep["after_retry"] == [".lock", "LATEST", "step-000001"]
        # A second save of the committed step is refused on both ranks, naming it.
        assert rep["second_writer"][0] == "CheckpointException", rep["second_writer"]
        assert "step-000001" in rep["second_writer"][1] and "overwrite=True" in rep["second_writer"][1]
        assert rep["second_named"][0] == "CheckpointException", rep["second_named"]
        assert "step-1" in rep["second_named"][1] and "exists" in rep["second_named"][1]
        assert rep["after_refusal"] == [".lock", "LATEST", "step-000001"]
        assert rep["loaded"] == rep["saved"]


# ckpt import: a FileSystemWriter checkpoint of 2-rank FSDP2 state made a tlio step.


def test_an_imported_filesystem_writer_checkpoint_verifies_and_reloads_bitwise_resharded(saved, tmp_path):
    tmp, ranks = saved
    source = tmp / "fs" / "step-1"
    before = {p.name: p.read_bytes() for p in source.iterdir()}
    out = cli("ckpt", "import", str(source), "-o", str(tmp_path / "run"), env={**os.environ, "TLIO_PYTHON": sys.executable})
    assert out.stdout.strip() == str(tmp_path / "run" / "step-000001"), out.stderr
    assert {p.name: p.read_bytes() for p in source.iterdir()} == before  # the source is unchanged
    step = tmp_path / "run" / "step-000001"
    assert sorted(os.listdir(step)) == ["MANIFEST.json", "dcp-rank00000.safetensors", "dcp-rank00001.safetensors",
                                        "shards.json", "trainer_state.json"]
    assert cli("ckpt", "verify", str(step)).returncode == 0
    expected = {"digests": ranks[0]["saved1"], "extra": child.EXTRA}
    assert plain_load(storage_reader=tlio.dcp.Reader(tmp_path / "run")) == expected
    # From Python, another step number; a second import of one step is refused.
    again = tlio.dcp.import_checkpoint(source, tmp_path / "run", step=9)
    assert again == str(tmp_path / "run" / "step-000009")
    with pytest.raises(ValueError, match="step-000009"):
        tlio.dcp.import_checkpoint(source, tmp_path / "run", step=9)


def _copy_source(saved, tmp_path) -> Path:
    tmp, _ = saved
    source = tmp_path / "src" / "step-1"
    shutil.copytree(tmp / "fs" / "step-1", source)
    return source


def _flip_a_tensor_byte(source: Path) -> None:
    """Flip one byte inside the data of the largest tensor item of rank 1's file."""
    import io

    from tlio._dcp_import import read_metadata

    md = read_metadata(str(source))
    _, info = max(((i, s) for i, s in md.storage_data.items() if s.relative_path == "__1_0.distcp"
                   and i.offset is not None), key=lambda kv: kv[1].length)
    path = source / info.relative_path
    data = bytearray(path.read_bytes())
    item = bytes(data[info.offset:info.offset + info.length])
    raw = torch.load(io.BytesIO(item), weights_only=True).contiguous().view(torch.uint8).numpy().tobytes()
    at = item.find(raw)
    assert at > 0
    data[info.offset + at + len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncate", "delete", "flip", "foreign-global"])
def test_a_damaged_dcp_checkpoint_is_refused_by_import_naming_the_file_and_nothing_is_committed(saved, tmp_path, how):
    source = _copy_source(saved, tmp_path)
    rank1 = source / "__1_0.distcp"
    if how == "truncate":
        rank1.write_bytes(rank1.read_bytes()[:-100])
        err, what = ValueError, "__1_0.distcp.*past the file"
    elif how == "delete":
        rank1.unlink()
        err, what = FileNotFoundError, "__1_0.distcp: no such file"
    elif how == "flip":
        # FileSystemReader loads this silently (test above); the record's CRC-32 catches it.
        _flip_a_tensor_byte(source)
        err, what = ValueError, "__1_0.distcp: .* the torch.save archive is damaged: Bad CRC-32"
    else:
        # A pickle that would run a command when loaded by pickle.load (as DCP's reader does).
        marker = tmp_path / "ran"
        (source / ".metadata").write_bytes(b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR.")
        err, what = ValueError, r"\.metadata: not a DCP metadata pickle: it names os.system"
    with pytest.raises(err, match=what):
        tlio.dcp.import_checkpoint(source, tmp_path / "run")
    assert not (tmp_path / "run").exists() or not any(p.name.startswith("step-") for p in (tmp_path / "run").iterdir())
    if how == "foreign-global":
        assert not (tmp_path / "ran").exists()
    out = cli("ckpt", "import", str(source), "-o", str(tmp_path / "run"), check=False,
              env={**os.environ, "TLIO_PYTHON": sys.executable})
    assert out.returncode == (2 if how == "delete" else 1), out.stderr
    assert out.stdout == "" and out.stderr.startswith("tlio: error: ") and out.stderr.count("\n") == 1, out.stderr


def test_import_opens_each_source_file_once_for_all_its_items(tmp_path, monkeypatch):
    import builtins

    state = {"model": {f"t{i}": torch.full((3, i + 1), float(i)) for i in range(6)}, "extra": {"epoch": 3}}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp_path / "fs"), no_dist=True)
    opened = []
    real_os_open, real_open = os.open, builtins.open

    def counting_os_open(path, *a, **k):
        opened.append(os.fspath(path))
        return real_os_open(path, *a, **k)

    def counting_open(file, *a, **k):
        if isinstance(file, (str, os.PathLike)):
            opened.append(os.fspath(file))
        return real_open(file, *a, **k)

    monkeypatch.setattr(os, "open", counting_os_open)
    monkeypatch.setattr(builtins, "open", counting_open)
    path = tlio.dcp.import_checkpoint(tmp_path / "fs", tmp_path / "run", step=1)
    monkeypatch.undo()
    sources = [p for p in opened if p.endswith(".distcp")]
    assert sources and len(sources) == len(set(sources)), sources  # seven items, one open per file
    back = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}, "extra": {"epoch": 0}}
    dcp.load(back, storage_reader=tlio.dcp.Reader(path), no_dist=True)
    assert back["extra"] == {"epoch": 3}
    assert all(torch.equal(back["model"][k], v) for k, v in state["model"].items())
