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


def test_a_name_utf8_cannot_hold_is_a_value_error_and_a_non_str_a_type_error(tmp_path):
    """A tensor name with a lone surrogate is a str whose value no safetensors file can
    hold: a ValueError naming it (never "names must be str"); an int name a TypeError."""
    bad = "w\udc80"
    cases = [
        (lambda n: ckpt.save_checkpoint(tmp_path / "m", {n: np.zeros(2, np.float32)}, None, 1, None, {}),
         "model name"),
        (lambda n: ckpt.save_checkpoint(tmp_path / "o", MODEL, {"type": "sgd", "lr": 0.1, "momentum": 0.9,
                                                                "state": {"w": {n: np.zeros(3, np.float32)}}},
                                        1, None, {}), "optimizer state key"),
    ]
    for call, what in cases:
        with pytest.raises(ValueError, match=f"{what} 'w\\\\udc80' is not valid UTF-8") as info:
            call(bad)
        assert not isinstance(info.value, TypeError)
        with pytest.raises(TypeError, match=f"{what} must be str, got int"):
            call(7)
    assert not (tmp_path / "m").exists() and not (tmp_path / "o").exists()
