"""Secure aggregation simulated (fedmtl.privacy.secagg): masks cancel exactly in the ring, the
server's sum is the plain sum up to rounding, and a masked update reveals nothing of its own."""

import pytest
import torch

from fedmtl.privacy.secagg import (
    FRACTION_BITS,
    MASK_CHUNK,
    RING_BITS,
    check_range,
    dequantise,
    masked_input,
    pair_mask,
    quantisation_bound,
    quantise,
    secure_sum,
    unmasked_sum,
)

RING = 2**RING_BITS
MEMBERS = [3, 7, 11, 20]


def _values(members=4, numel=5000, scale=0.3, seed=0):
    return (
        torch.randn(members, numel, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        * scale
    )


def test_quantise_by_hand():
    x = torch.tensor([0.0, 1.0, -1.0, 2.0**-16, -(2.0**-17) * 3])
    assert quantise(x).tolist() == [0, 2**16, RING - 2**16, 1, RING - 2]  # -1.5 LSB rounds to even: -2
    assert quantise(x).dtype == torch.int64
    assert dequantise(quantise(x)).tolist() == [0.0, 1.0, -1.0, 2.0**-16, -(2.0**-15)]
    assert quantisation_bound(4) == 4 * 2.0 ** -(FRACTION_BITS + 1)


def test_masks_cancel_exactly_in_the_ring():
    values = _values()
    masked = torch.stack([masked_input(v, me, MEMBERS, 5, 2, "encoder") for v, me in zip(values, MEMBERS)])
    assert masked.dtype == torch.int64 and int(masked.min()) >= 0 and int(masked.max()) < RING
    plain = torch.stack([quantise(v) for v in values])
    assert not torch.equal(masked, plain)
    assert torch.equal(
        torch.remainder(masked.sum(0) - plain.sum(0), RING), torch.zeros(values.shape[1], dtype=torch.int64)
    )


def test_secure_sum_within_the_quantisation_bound():
    values = _values()
    got = secure_sum(values, MEMBERS, 5, 2, "encoder")
    assert got.dtype == torch.float64
    # exactly the sum of the quantised values ...
    assert torch.equal(got, dequantise(torch.stack([quantise(v) for v in values]).sum(0)))
    # ... so within the documented bound of the plain float64 sum, and not always equal to it
    error = (got - values.sum(0)).abs()
    assert float(error.max()) <= quantisation_bound(len(MEMBERS))
    assert float(error.max()) > 0
    assert torch.equal(unmasked_sum(torch.stack([quantise(v) for v in values])), got)


def test_block_reads_equal_a_whole_read():
    numel = MASK_CHUNK + 300  # crosses a chunk boundary
    whole = pair_mask(1, 0, "k", 2, 9, numel)
    cut = [0, 1000, MASK_CHUNK - 50, MASK_CHUNK + 10, numel]
    blocks = [pair_mask(1, 0, "k", 9, 2, b - a, a) for a, b in zip(cut, cut[1:])]
    assert torch.equal(torch.cat(blocks), whole)
    x = _values(1, numel)[0]
    by_block = torch.cat([masked_input(x[a:b], 2, [2, 9], 1, 0, "k", a) for a, b in zip(cut, cut[1:])])
    assert torch.equal(by_block, masked_input(x, 2, [2, 9], 1, 0, "k"))


def test_masked_update_uncorrelated_with_update():
    x = _values(1, 100_000, scale=1.0, seed=3)[0]
    seen = dequantise(masked_input(x, 7, MEMBERS, 5, 2, "encoder"))
    r = torch.corrcoef(torch.stack([seen, x]))[0, 1]
    assert abs(float(r)) < 0.05


def test_masks_are_deterministic_and_distinct():
    mask = pair_mask(5, 2, "encoder", 3, 7, 1000)
    assert torch.equal(mask, pair_mask(5, 2, "encoder", 7, 3, 1000))  # shared by the pair
    for other in [
        (6, 2, "encoder", 3, 7),
        (5, 3, "encoder", 3, 7),
        (5, 2, "decoder", 3, 7),
        (5, 2, "encoder", 3, 11),
    ]:
        assert not torch.equal(mask, pair_mask(*other, 1000))
    assert int(mask.min()) >= 0 and int(mask.max()) < RING
    assert int(mask.max()) >= 2**31  # the whole ring is used, not only its lower half
    values = _values()
    assert torch.equal(secure_sum(values, MEMBERS, 5, 2, "e"), secure_sum(values, MEMBERS, 5, 2, "e"))


def test_range_refusal_is_one_line():
    limit = 2.0 ** (RING_BITS - 1 - FRACTION_BITS)
    check_range(torch.full((3,), limit / 4 - 1), 4, "the update 'encoder'")  # fits
    with pytest.raises(ValueError) as error:
        check_range(torch.tensor([0.1, -limit / 4]), 4, "the update 'encoder'")
    message = str(error.value)
    assert "\n" not in message
    assert message == (
        "the update 'encoder' has an entry of magnitude 8192; summed over 4 members it could reach 32768, outside "
        "secure aggregation's range ±32768 (32-bit fixed point with 16 fraction bits): set privacy.clip below 8192"
    )
    with pytest.raises(ValueError, match="non-finite entry"):
        check_range(torch.tensor([float("nan")]), 2, "u")
    with pytest.raises(ValueError, match="'big'.*outside secure aggregation's range"):
        secure_sum(torch.full((2, 3), 20_000.0), [0, 1], 0, 0, "big")
