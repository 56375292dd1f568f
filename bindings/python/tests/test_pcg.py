"""tlio.pcg: tokens.md's PCG32 and its test vectors."""

import copy
import pickle

import numpy as np
import pytest

from tlio.pcg import PCG32


def test_seed_42_vectors():
    r = PCG32(42)
    assert r.state() == {"state": 0x185706B82C2E03F8, "inc": 0x6D}
    assert [r.next_u32() for _ in range(6)] == [
        0xA15C02B7, 0x7B47F409, 0xBA1D3330, 0x83D2F293, 0xBFA4784B, 0xCBED606E,
    ]


def test_below_3_vectors():
    r = PCG32(42, 54)
    assert [r.below(3) for _ in range(10)] == [0, 0, 2, 1, 1, 1, 2, 0, 0, 2]


def test_state_roundtrip_continues_bit_for_bit():
    a = PCG32(7, seq=3)
    for _ in range(5):
        a.next_u32()
    b = PCG32.from_state(**a.state())
    c = PCG32(0)
    c.set_state(a.state())
    assert b == c
    assert [a.next_u32() for _ in range(20)] == [b.next_u32() for _ in range(20)]
    c2 = PCG32(0)
    c2.set_state({"state": format(b.state()["state"], "016x"), "inc": format(b.state()["inc"], "016x")})
    assert c2 == b


def test_even_increment_is_a_value_error_everywhere():
    with pytest.raises(ValueError, match="even"):
        PCG32.from_state(1, 2)
    r = PCG32(1)
    with pytest.raises(ValueError, match="even"):
        r.set_state({"state": 1, "inc": 4})
    assert r == PCG32(1)  # a refused state leaves the generator as it was


@pytest.mark.parametrize("bad", [0, -1, 2**32, "x"])
def test_below_rejects_bad_bounds(bad):
    with pytest.raises(ValueError):
        PCG32(1).below(bad)


@pytest.mark.parametrize("bad", [-1, 2**64, 1.5, None])
def test_seed_rejects_non_u64(bad):
    with pytest.raises(ValueError):
        PCG32(bad)


@pytest.mark.parametrize("bad", ["42", "0x42", b"42", 4.0, True, False])
def test_every_integer_argument_refuses_str_float_and_bool(bad):
    # "42" once meant 0x42 silently, 4.0 meant 4 and True meant 1.
    for call in (
        lambda: PCG32(bad),
        lambda: PCG32(1, bad),
        lambda: PCG32.from_state(bad, 3),
        lambda: PCG32.from_state(1, bad),
        lambda: PCG32(1).below(bad),
    ):
        with pytest.raises(ValueError, match="integer"):
            call()


def test_integer_arguments_take_numpy_integers():
    assert PCG32(np.int64(42), np.uint8(54)) == PCG32(42)
    assert PCG32.from_state(np.uint64(5), np.int32(7)) == PCG32.from_state(5, 7)


def test_a_saved_state_takes_ints_or_exactly_16_hex_digits():
    r = PCG32(1)
    r.set_state({"state": "185706b82c2e03f8", "inc": "000000000000006d"})
    assert r == PCG32(42)
    for loose in ["6d", "0x6d", "000000000000006D", " 000000000000006d"]:
        with pytest.raises(ValueError, match="16 lowercase hexadecimal"):
            r.set_state({"state": 1, "inc": loose})
    with pytest.raises(ValueError, match="integer"):
        r.set_state({"state": 1.0, "inc": 3})


def test_set_state_rejects_bad_dicts():
    r = PCG32(1)
    for bad in [{}, {"state": 1}, {"state": 1, "inc": 3, "x": 0}, [1, 3], {"state": "zz", "inc": 3}]:
        with pytest.raises(ValueError):
            r.set_state(bad)


def test_copy_and_pickle_keep_the_position():
    r = PCG32(99)
    r.next_u32()
    for other in (copy.copy(r), copy.deepcopy(r), pickle.loads(pickle.dumps(r))):
        assert other == r and other is not r
        assert other.next_u32() == PCG32.from_state(**r.state()).next_u32()
    assert "PCG32.from_state(" in repr(r)
