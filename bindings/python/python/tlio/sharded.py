"""Sharded checkpoints (docs/checkpoints.md, "Sharded steps") over tlio's Rust core: the
building blocks ``tlio.torch`` uses under torch.distributed, usable without torch.

A sharded step is a checkpoint step directory whose manifest lists ``shards.json``,
the chunk table (docs/checkpoints.md): each global tensor of the groups ``"model"`` and
``"optimizer"`` with its chunks (offsets and sizes in the global tensor, the rank file
and key holding it, its byte range, BLAKE3 digests of its 1 MiB pieces).

Saving, in three calls:

- rank 0: ``save = begin(dir, step, overwrite=False)`` takes the checkpoint lock and
  creates ``save.tmp_dir`` holding a probe file whose token is ``save.probe``
  (broadcast both);
- every rank, before writing: ``check_shared(tmp_dir, probe)`` reads the probe back, so
  a directory that is not shared between the hosts of the job (node-local disk) is
  refused at once with an error naming it, before any file is written (on object
  storage ``probe`` is None: there is nothing to check);
- every rank: ``table = write_rank_file(save.tmp_dir, "model-rank00003.safetensors",
  [(key, dtype, shape, uint8_array), ...])`` writes one canonical safetensors file,
  hashing while writing, and returns a small JSON-able dict (gather it to rank 0);
- rank 0: ``save.commit(files, tensors, meta, state_json, rng, config, keep)`` checks
  that the chunks of every tensor lie inside its shape, never overlap and cover it,
  writes ``shards.json``, the trainer state and the manifest last, and commits with the
  same protocol as every tlio save (fsyncs, renames, LATEST, keep); ``save.abort()``
  commits nothing.

Loading: ``step = open_step(dir, step=None)`` picks the step ``tlio ckpt latest``
picks (an unsharded step too), then ``step.read(group, name, offsets, sizes, out)`` (or
``read_many``) fills a writable C-contiguous uint8 array with a region of a global
tensor, reading only the pieces that overlap it and verifying each one. A corrupt piece
is a ``ValueError`` naming the file, the tensor and the piece.

On object storage (``dir`` an ``s3://bucket/prefix`` URL, docs/object-storage.md) the
same calls work: ``begin`` takes no lock (the conditional creation of the manifest
decides between writers) and ``save.tmp_dir`` is the URL of a fresh attempt
(``s3://bucket/prefix/step-N/attempt-<hex>``) under which ``write_rank_file`` uploads;
``open_step`` reads byte ranges of the objects, verified piece by piece.

Every call releases the GIL while it works. Nothing here pickles.
"""

from tlio._tlio.sharded import (
    DIGEST,
    DTYPES,
    FORMAT,
    GROUPS,
    PIECE_BYTES,
    SHARDS_NAME,
    VERSION,
    ShardedSave,
    ShardedStep,
    begin,
    check_shared,
    open_step,
    write_rank_file,
)

__all__ = [
    "begin",
    "check_shared",
    "write_rank_file",
    "open_step",
    "ShardedSave",
    "ShardedStep",
    "FORMAT",
    "VERSION",
    "SHARDS_NAME",
    "PIECE_BYTES",
    "DIGEST",
    "GROUPS",
    "DTYPES",
]
