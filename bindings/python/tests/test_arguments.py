"""Integer arguments across the package: every one takes an int or a numpy integer and
refuses a str, a float or a bool with a ValueError naming it (none is read leniently, as
``PCG32("42")`` once was, silently meaning ``PCG32(0x42)``)."""

import numpy as np
import pytest

import tlio.checkpoint as ckpt
import tlio.tokens as tokens
from tlio.pcg import PCG32

from _tokens_helpers import write_shard

MODEL = {"w": np.zeros(3, np.float32)}


def calls(tmp_path):
    shard = write_shard(tmp_path / "s.bin", range(10, 40))
    done = tmp_path / "done"
    ckpt.save_checkpoint(done, MODEL, None, 4, None, {})
    return {
        "seed": lambda v: PCG32(v),
        "seq": lambda v: PCG32(1, v),
        "state": lambda v: PCG32.from_state(v, 3),
        "inc": lambda v: PCG32.from_state(1, v),
        "bound": lambda v: PCG32(1).below(v),
        "vocab_size": lambda v: tokens.open_tokens(shard, vocab_size=v),
        "seq_len": lambda v: tokens.TokenStream([shard], v, 2, PCG32(1)),
        "batch": lambda v: tokens.TokenStream([shard], 4, v, PCG32(1)),
        "rank": lambda v: tokens.TokenStream([shard], 4, 2, PCG32(1), rank=v, world_size=2),
        "world_size": lambda v: tokens.TokenStream([shard], 4, 2, PCG32(1), world_size=v),
        "rng state": lambda v: tokens.TokenStream([shard], 4, 2, {"state": v, "inc": 3}),
        "step": lambda v: ckpt.step_name(v),
        "step ": lambda v: ckpt.save_checkpoint(tmp_path / "a", MODEL, None, v, None, {}),
        "keep": lambda v: ckpt.save_checkpoint(tmp_path / "b", MODEL, None, 5, None, {}, keep=v),
        "rng_state": lambda v: ckpt.save_checkpoint(
            tmp_path / "c", MODEL, None, 5, {"state": v, "inc": 3}, {}
        ),
        "tokens_seen": lambda v: ckpt.save_checkpoint(
            tmp_path / "d", MODEL, None, 5, None, {"tokens_seen": v}
        ),
        "step  ": lambda v: ckpt.load_checkpoint(done, step=v),
    }


@pytest.mark.parametrize("bad", ["4", 4.0, True, b"4"])
def test_every_integer_argument_refuses_str_float_bool_with_value_error(tmp_path, bad):
    for name, call in calls(tmp_path).items():
        with pytest.raises(ValueError) as info:
            call(bad)
        # An argument of the call is named; a field of `extra` is refused by the
        # trainer state's schema or its JSON conversion, which name `extra` or the state.
        named = name.strip().split()[0]
        if name == "tokens_seen":
            assert "extra" in str(info.value) or "trainer state" in str(info.value), info.value
        else:
            assert named in str(info.value), (name, info.value)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_every_integer_argument_takes_a_numpy_integer(tmp_path):
    special = {"inc": 1, "rank": 1, "world_size": 1, "vocab_size": 256}
    for name, call in calls(tmp_path).items():
        call(np.int64(special.get(name, 4)))
