"""tlio.sharded without torch.distributed: several "ranks" (plain function calls) write
their chunks of numpy tensors as rank files, rank 0 commits the chunk table, and any
region read back at another sharding is bitwise the region of the saved tensor; corrupt
pieces, gaps and overlaps are refused with errors that name them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tlio.checkpoint
import tlio.sharded as sh
from safetensors.numpy import load_file

STATE = json.dumps({"step": 0})


def state(step: int) -> str:
    return json.dumps({"step": step, "tokens_seen": 7 * step})


def bits(a: np.ndarray) -> np.ndarray:
    """The raw bytes of an array, flat."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def row_chunks(shape: Tuple[int, ...], parts: int) -> List[Tuple[List[int], List[int]]]:
    """Split dimension 0 like torch.chunk (FSDP2's Shard(0)), dropping empty chunks."""
    if not shape:
        return [([], [])]
    if 0 in shape:
        return [([0] * len(shape), list(shape))]
    n = shape[0]
    step = -(-n // parts) if n else 1
    out = []
    for start in range(0, n, step):
        size = min(step, n - start)
        out.append(([start] + [0] * (len(shape) - 1), [size] + list(shape[1:])))
    return out or [([0] * len(shape), list(shape))]


def col_chunks(shape, parts):
    """Split the last dimension (tensor parallel's column split)."""
    if len(shape) < 2 or 0 in shape:
        return row_chunks(shape, parts)
    n = shape[-1]
    step = -(-n // parts)
    return [
        ([0] * (len(shape) - 1) + [s], list(shape[:-1]) + [min(step, n - s)])
        for s in range(0, n, step)
    ]


def region(a: np.ndarray, offsets, sizes) -> np.ndarray:
    return a[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))]


def save_sharded(ckpt: Path, step: int, tensors: Dict[Tuple[str, str], np.ndarray], ranks: int, split, meta=None, keep=None):
    """Every rank writes the chunks of rank r (chunk i goes to rank i % ranks)."""
    save = sh.begin(ckpt, step)
    per_rank: Dict[int, list] = {r: [] for r in range(ranks)}
    entries = []
    for (group, name), arr in sorted(tensors.items()):
        chunks = []
        for i, (o, s) in enumerate(split(arr.shape, ranks)):
            r = i % ranks
            key = f"{name}@{','.join(map(str, o))}"
            file = f"{group}-rank{r:05d}.safetensors"
            data = bits(region(arr, o, s))
            per_rank[r].append((group, (key, DTYPE[arr.dtype.str], s, data)))
            chunks.append({"offsets": o, "sizes": s, "file": file, "key": key})
        entries.append({"group": group, "name": name, "dtype": DTYPE[arr.dtype.str], "shape": list(arr.shape), "chunks": chunks})
    files = []
    for r, items in per_rank.items():
        for group in ("model", "optimizer"):
            mine = [c for g, c in items if g == group]
            if mine:
                files.append(sh.write_rank_file(save.tmp_dir, f"{group}-rank{r:05d}.safetensors", mine))
    files = json.loads(json.dumps(files))  # what a gather over JSON would hand rank 0
    return save.commit(files, entries, meta or {}, state(step), None, None, keep)


DTYPE = {"<f4": "F32", "<f2": "F16", "<i8": "I64", "|u1": "U8", "<u2": "BF16", "<f8": "F64", "|b1": "BOOL"}


def sample_tensors(rng: np.random.Generator) -> Dict[Tuple[str, str], np.ndarray]:
    return {
        ("model", "wte"): rng.standard_normal((37, 24)).astype(np.float32),
        ("model", "ln.bias"): rng.standard_normal(24).astype(np.float16),
        ("model", "step_count"): np.array(5, np.int64),
        ("model", "empty"): np.zeros((0, 3), np.float32),
        ("optimizer", "wte.exp_avg"): rng.standard_normal((37, 24)).astype(np.float32),
        ("optimizer", "wte.exp_avg_sq"): rng.random((37, 24)).astype(np.float32),
    }


def read_region(step, group, name, dtype, offsets, sizes) -> np.ndarray:
    out = np.empty(sizes, dtype)
    step.read(group, name, offsets, sizes, out.reshape(-1).view(np.uint8))
    return out


def test_rank_files_commit_and_read_back_at_other_shardings(tmp_path):
    rng = np.random.default_rng(1)
    tensors = sample_tensors(rng)
    path = save_sharded(tmp_path, 10, tensors, ranks=4, split=row_chunks, meta={"model": {"tied": "{}"}})
    assert Path(path).name == "step-000010"
    assert tlio.checkpoint.verify_step_dir(path) == []
    step = sh.open_step(tmp_path)
    assert (step.step, step.sharded, step.meta) == (10, True, {"model": {"tied": "{}"}})
    assert json.loads(step.state_json)["tokens_seen"] == 70
    listed = step.tensors()
    for (group, name), arr in tensors.items():
        assert listed[(group, name)] == (DTYPE[arr.dtype.str], list(arr.shape))
        # The whole tensor, then every chunk of a 3-way column split and a 2-way row split.
        whole = read_region(step, group, name, arr.dtype, [0] * arr.ndim, list(arr.shape))
        assert whole.tobytes() == arr.tobytes()
        for split in (col_chunks, row_chunks):
            for o, s in split(arr.shape, 3 if split is col_chunks else 2):
                got = read_region(step, group, name, arr.dtype, o, s)
                assert got.tobytes() == np.ascontiguousarray(region(arr, o, s)).tobytes()


def test_read_many_fills_every_region_in_one_call(tmp_path):
    rng = np.random.default_rng(2)
    tensors = sample_tensors(rng)
    save_sharded(tmp_path, 3, tensors, ranks=3, split=col_chunks)
    step = sh.open_step(tmp_path)
    reads, outs = [], []
    for (group, name), arr in tensors.items():
        for o, s in row_chunks(arr.shape, 2):
            out = np.empty(s, arr.dtype)
            outs.append((out, region(arr, o, s)))
            reads.append((group, name, o, s, out.reshape(-1).view(np.uint8)))
    step.read_many(reads)
    for out, want in outs:
        assert out.tobytes() == np.ascontiguousarray(want).tobytes()


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 40),
    cols=st.integers(1, 9),
    save_ranks=st.integers(1, 5),
    load_parts=st.integers(1, 6),
    cut=st.sampled_from(["rows", "cols"]),
)
def test_any_saved_sharding_reads_back_at_any_other(tmp_path_factory, rows, cols, save_ranks, load_parts, cut):
    ckpt = tmp_path_factory.mktemp("ckpt")
    arr = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) * np.float32(1.5) - 7
    save_split = row_chunks if cut == "rows" else col_chunks
    save_sharded(ckpt, 1, {("model", "w"): arr}, ranks=save_ranks, split=save_split)
    step = sh.open_step(ckpt)
    load_split = col_chunks if cut == "rows" else row_chunks
    for o, s in load_split(arr.shape, load_parts):
        got = read_region(step, "model", "w", np.float32, o, s)
        assert got.tobytes() == np.ascontiguousarray(region(arr, o, s)).tobytes()


def test_an_unsharded_step_reads_through_the_same_calls(tmp_path):
    model = {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}
    tlio.checkpoint.save_checkpoint(tmp_path, model, None, 5, None, None)
    step = sh.open_step(tmp_path)
    assert (step.step, step.sharded) == (5, False)
    assert step.tensors() == {("model", "w"): ("F32", [3, 4])}
    got = read_region(step, "model", "w", np.float32, [1, 1], [2, 2])
    assert got.tobytes() == model["w"][1:3, 1:3].tobytes()


def flip_byte(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x01]))


def test_a_flipped_byte_in_one_rank_file_fails_verify_and_the_read_that_uses_it(tmp_path):
    arr = np.arange(64, dtype=np.float32).reshape(8, 8)
    save_sharded(tmp_path, 1, {("model", "w"): arr}, ranks=2, split=row_chunks)
    path = save_sharded(tmp_path, 2, {("model", "w"): arr + 1}, ranks=2, split=row_chunks)
    victim = Path(path) / "model-rank00001.safetensors"
    flip_byte(victim, victim.stat().st_size - 3)
    problems = tlio.checkpoint.verify_step_dir(path)
    assert any("model-rank00001.safetensors" in p for p in problems), problems
    # open_step checks sizes and headers only; the read of the damaged piece fails.
    step = sh.open_step(tmp_path)
    assert step.step == 2
    ok = read_region(step, "model", "w", np.float32, [0, 0], [4, 8])
    assert ok.tobytes() == (arr + 1)[:4].tobytes()
    with pytest.raises(ValueError, match=r"model-rank00001\.safetensors: piece 0 .* model/w"):
        read_region(step, "model", "w", np.float32, [4, 0], [4, 8])
    # Falling back to the older step, as tlio.torch does after a failed read.
    older = sh.open_step(tmp_path, step=1)
    assert read_region(older, "model", "w", np.float32, [0, 0], [8, 8]).tobytes() == arr.tobytes()


@pytest.mark.parametrize(
    "chunks, rule",
    [
        ([([0, 0], [2, 4])], "cover 8 of its 16 elements"),
        ([([0, 0], [3, 4]), ([2, 0], [2, 4])], "overlaps"),
        ([([0, 0], [2, 4]), ([2, 0], [3, 4])], "outside the shape"),
    ],
)
def test_gaps_overlaps_and_out_of_bounds_chunks_are_refused_and_nothing_is_committed(tmp_path, chunks, rule):
    arr = np.zeros((5, 4), np.float32)[:4]
    save = sh.begin(tmp_path, 1)
    items, entries = [], []
    for i, (o, s) in enumerate(chunks):
        key = f"w{i}"
        items.append((key, "F32", s, bits(np.zeros(s, np.float32))))
        entries.append({"offsets": o, "sizes": s, "file": "model-rank00000.safetensors", "key": key})
    table = sh.write_rank_file(save.tmp_dir, "model-rank00000.safetensors", items)
    tensor = {"group": "model", "name": "w", "dtype": "F32", "shape": list(arr.shape), "chunks": entries}
    with pytest.raises(ValueError, match=rule):
        save.commit([table], [tensor], {}, state(1), None, None, None)
    assert sorted(os.listdir(tmp_path)) == [".lock"]
    with pytest.raises(FileNotFoundError):
        sh.open_step(tmp_path)


def test_a_second_writer_waits_for_the_lock_and_abort_commits_nothing(tmp_path):
    save = sh.begin(tmp_path, 1)
    assert os.path.isdir(save.tmp_dir)
    save.abort()
    assert not os.path.exists(save.tmp_dir)
    save.abort()
    again = sh.begin(tmp_path, 1)
    again.abort()


def test_a_rank_that_does_not_see_rank_0s_directory_is_refused_before_writing(tmp_path):
    """The probe of begin: the directory rank 0 made passes; another host's view of the
    same path (missing, a directory of its own, another save's) is a ValueError naming
    the checkpoint directory as not shared; a committed step holds no probe."""
    ckpt, elsewhere = tmp_path / "ckpt", tmp_path / "other-host" / "ckpt"
    save = sh.begin(ckpt, 1)
    assert isinstance(save.probe, str) and len(save.probe) == 32
    sh.check_shared(save.tmp_dir, save.probe)
    mirror = str(elsewhere / Path(save.tmp_dir).name)  # the same path, seen from a host of its own
    with pytest.raises(ValueError, match="which does not exist here") as e:
        sh.check_shared(mirror, save.probe)
    assert str(e.value).startswith(f"{elsewhere} is not shared between the hosts of this save: ")
    own = sh.begin(elsewhere, 1)  # that host's own step-000001.tmp, holding its own probe
    with pytest.raises(ValueError, match="is another save's, not rank 0's"):
        sh.check_shared(own.tmp_dir, save.probe)
    os.remove(os.path.join(own.tmp_dir, ".shared-probe"))
    with pytest.raises(ValueError, match="holds no .shared-probe"):
        sh.check_shared(own.tmp_dir, save.probe)
    own.abort()
    save.abort()
    path = save_sharded(ckpt, 2, {("model", "w"): np.arange(6, dtype=np.float32)}, ranks=2, split=row_chunks)
    assert sorted(os.listdir(path)) == ["MANIFEST.json", "model-rank00000.safetensors",
                                        "model-rank00001.safetensors", "shards.json", "trainer_state.json"]
    assert tlio.checkpoint.verify_step_dir(path) == []


def test_rank_file_is_canonical_safetensors_with_its_sha256(tmp_path):
    save = sh.begin(tmp_path, 1)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(3, dtype=np.int64)
    table = sh.write_rank_file(save.tmp_dir, "model-rank00000.safetensors", [("b", "I64", [3], bits(b)), ("a", "F32", [2, 3], bits(a))])
    path = Path(save.tmp_dir) / "model-rank00000.safetensors"
    import hashlib

    assert table["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert table["size"] == path.stat().st_size
    loaded = load_file(str(path))
    assert loaded["a"].tobytes() == a.tobytes() and loaded["b"].tobytes() == b.tobytes()
    assert set(table["tensors"]) == {"a", "b"}
    with pytest.raises(ValueError, match="bytes given"):
        sh.write_rank_file(save.tmp_dir, "model-rank00001.safetensors", [("a", "F32", [2, 2], bits(a))])
    with pytest.raises(ValueError, match="plain file name"):
        sh.write_rank_file(save.tmp_dir, "../x.safetensors", [])
    save.abort()


def test_export_is_read_back_by_the_safetensors_package_in_bounded_memory(tmp_path):
    """`tlio ckpt export` of a 4-rank step whose largest tensor (192 MiB) is far larger
    than the export's working memory: the safetensors package reads back every model
    tensor bit for bit (the optimizer's are not exported), and the CLI's peak resident
    set stays below the largest tensor."""
    import subprocess
    import sys

    from _tokens_helpers import TLIO_BIN

    rng = np.random.default_rng(7)
    tensors = {
        ("model", "big"): rng.random((3 * 4096, 4096), dtype=np.float32),
        ("model", "ln.bias"): rng.standard_normal(4096).astype(np.float16),
        ("model", "step_count"): np.array(5, np.int64),
        ("optimizer", "ln.bias.exp_avg"): rng.standard_normal(4096).astype(np.float32),
    }
    step_dir = save_sharded(tmp_path / "ck", 3, tensors, ranks=4, split=row_chunks, meta={"model": {"tied": "{}"}})
    out = tmp_path / "exported"
    # A child Python whose only child is the export: its RUSAGE_CHILDREN peak is the CLI's.
    measure = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.stderr.replace(chr(10), ' '))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", measure, str(TLIO_BIN), "ckpt", "export", str(step_dir), "-o", str(out), "--max-shard-size", "100MB"],
        capture_output=True, text=True, timeout=300, check=True,
    )
    code, peak_kib, stderr = done.stdout.split(" ", 2)
    assert code == "0", stderr
    assert int(peak_kib) * 1024 < 96 << 20, f"export peaked at {int(peak_kib) >> 10} MiB"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    got = {}
    for name in sorted(set(index["weight_map"].values())):
        got.update(load_file(str(out / name)))
    want = {name: arr for (group, name), arr in tensors.items() if group == "model"}
    assert sorted(got) == sorted(want)
    for name, arr in want.items():
        assert got[name].dtype == arr.dtype and got[name].shape == arr.shape
        assert got[name].tobytes() == arr.tobytes(), name


def test_rank_files_on_object_storage_commit_read_back_and_verify(s3):
    """The same calls on an s3:// prefix (the suite's local server): the ranks' objects
    go under the attempt begin draws, regions read back by range requests at other
    shardings (a tensor of several pieces included), a flipped byte fails the read that
    uses it and verify; a refused commit leaves nothing; an unsharded step opens too."""
    rng = np.random.default_rng(3)
    tensors = sample_tensors(rng)
    tensors[("model", "big")] = rng.standard_normal((1100, 600)).astype(np.float32)  # 2.5 pieces
    url = s3.url("run")
    path = save_sharded(url, 4, tensors, ranks=3, split=row_chunks)
    assert path == f"{url}/step-000004"
    keys = s3.keys("run/")
    attempt = keys[-1].split("/")[2]
    assert attempt.startswith("attempt-") and keys[0] == "run/LATEST"
    assert sorted(k.split("/")[-1] for k in keys if attempt in k) == sorted(
        ["shards.json", "trainer_state.json"]
        + [f"model-rank0000{r}.safetensors" for r in range(3)]
        + [f"optimizer-rank0000{r}.safetensors" for r in range(3)])
    assert tlio.checkpoint.verify_step_dir(path) == []
    step = sh.open_step(url)
    assert (step.step, step.sharded, step.path) == (4, True, path)
    reads, outs = [], []
    for (group, name), arr in tensors.items():
        for o, s in col_chunks(arr.shape, 2) + [([0] * arr.ndim, list(arr.shape))]:
            out = np.empty(s, arr.dtype)
            outs.append((out, region(arr, o, s)))
            reads.append((group, name, o, s, out.reshape(-1).view(np.uint8)))
    step.read_many(reads)
    for out, want in outs:
        assert out.tobytes() == np.ascontiguousarray(want).tobytes()
    step.close()

    # A flipped byte in rank 1's object: the read that uses it fails, naming the piece.
    key = f"run/step-000004/{attempt}/model-rank00001.safetensors"
    data = bytearray(s3.client.get_object(Bucket=s3.name, Key=key)["Body"].read())
    data[-5] ^= 1
    s3.client.put_object(Bucket=s3.name, Key=key, Body=bytes(data))
    step = sh.open_step(url)
    whole = [(g, n, [0] * a.ndim, list(a.shape), np.empty(a.shape, a.dtype).reshape(-1).view(np.uint8))
             for (g, n), a in tensors.items()]
    with pytest.raises(ValueError, match=r"model-rank00001\.safetensors: piece \d+ .* does not match"):
        step.read_many(whole)
    assert any("model-rank00001.safetensors" in p for p in tlio.checkpoint.verify_step_dir(path))

    # The ranks write only under an attempt; a refused commit removes the attempt.
    with pytest.raises(ValueError, match="attempt"):
        sh.write_rank_file(s3.url("run/step-000005"), "model-rank00000.safetensors", [])
    save = sh.begin(s3.url("other"), 1)
    assert save.tmp_dir.startswith(s3.url("other/step-000001/attempt-"))
    table = sh.write_rank_file(save.tmp_dir, "model-rank00000.safetensors",
                               [("w0", "F32", [2, 4], bits(np.zeros((2, 4), np.float32)))])
    tensor = {"group": "model", "name": "w", "dtype": "F32", "shape": [4, 4],
              "chunks": [{"offsets": [0, 0], "sizes": [2, 4], "file": "model-rank00000.safetensors", "key": "w0"}]}
    with pytest.raises(ValueError, match="cover 8 of its 16 elements"):
        save.commit([table], [tensor], {}, state(1), None, None, None)
    assert s3.keys("other/") == []

    # An unsharded step on object storage opens through the same calls.
    model = {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}
    tlio.checkpoint.save_checkpoint(s3.url("plain"), model, None, 5, None, None)
    step = sh.open_step(s3.url("plain"))
    assert (step.step, step.sharded) == (5, False)
    got = read_region(step, "model", "w", np.float32, [1, 1], [2, 2])
    assert got.tobytes() == model["w"][1:3, 1:3].tobytes()


def test_verifying_a_sharded_step_on_object_storage_downloads_each_object_once(s3):
    """verify (as ckpt verify, latest and gc run it) checks every file's sha256 and every
    piece digest from one download of each object: the bytes the server sends are the
    step's size plus its small files and headers read again, never a second copy of the
    data. A flipped byte is still found, by its piece, in the same words."""
    rng = np.random.default_rng(5)
    tensors = {("model", "w"): rng.standard_normal((1024, 1024)).astype(np.float32),  # 4 MiB
               ("optimizer", "w.exp_avg"): rng.standard_normal((1024, 1024)).astype(np.float32)}
    url = s3.url("once")
    path = save_sharded(url, 2, tensors, ranks=2, split=row_chunks)
    sizes = {k: o["Size"] for k, o in ((o["Key"], o) for o in s3.client.list_objects_v2(Bucket=s3.name, Prefix="once/step-000002/")["Contents"])}
    data = sum(v for k, v in sizes.items() if k.endswith(".safetensors"))
    small = sum(v for k, v in sizes.items() if not k.endswith(".safetensors"))
    before = int(s3.server.ask(f"served {s3.name}"))
    assert tlio.checkpoint.verify_step_dir(path) == []
    served = int(s3.server.ask(f"served {s3.name}")) - before
    # Read again beyond one copy: the manifest and JSON files, and each data object's
    # header by a range request (at most 64 KiB each).
    again = 2 * small + 4 * (64 << 10) + (4 << 10)
    assert data + small <= served <= data + small + again, (served, data, small)

    key = next(k for k in sizes if k.endswith("model-rank00001.safetensors"))
    body = bytearray(s3.client.get_object(Bucket=s3.name, Key=key)["Body"].read())
    body[-5] ^= 1
    s3.client.put_object(Bucket=s3.name, Key=key, Body=bytes(body))
    problems = tlio.checkpoint.verify_step_dir(path)
    assert len(problems) == 1 and "model-rank00001.safetensors" in problems[0], problems
