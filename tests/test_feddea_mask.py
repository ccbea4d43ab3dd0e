"""FedDEA's update transform (docs/methods.md, FedDEA): the hand case, exactly k survivors with ties,
equality with a full stable sort on hard inputs, ρ = 1 as identity, purity and bad ρ."""

import math

import pytest
import torch

import fedmtl.aggregation.feddea as feddea
from fedmtl.aggregation import feddea_k, feddea_mask

RHOS = [1e-6, 0.01, 0.25, 0.3, 0.5, 0.999]


def _reference(updates: torch.Tensor, rho: float, rescale: bool = True) -> torch.Tensor:
    """Keep the first k positions of a stable descending sort of |Δ| (ties: lowest index
    first, NaN largest), written independently of feddea_mask's sampling and counting."""
    out = torch.zeros_like(updates)
    k = feddea_k(rho, updates.shape[1])
    for i, row in enumerate(updates):
        keep = torch.sort(row.abs(), descending=True, stable=True).indices[:k]
        out[i, keep] = row[keep] * (1 / rho) if rescale else row[keep]
    return out


def _assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Same dtype and the same values bit for bit, NaN where NaN."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(actual.isnan(), expected.isnan())
    assert torch.equal(actual.nan_to_num(0.0), expected.nan_to_num(0.0))


def _inputs() -> dict[str, torch.Tensor]:
    """Rows above and below the size at which feddea_mask starts sampling (2**15 entries)."""
    g = torch.Generator().manual_seed(11)
    wide, narrow = 60_000, 1_000
    return {
        "random": torch.randn(3, wide, generator=g) * 1e-3,
        "random_narrow": torch.randn(4, narrow, generator=g),
        "tied_few_values": torch.randint(-2, 3, (3, wide), generator=g).float(),
        "tied_few_values_narrow": torch.randint(-2, 3, (3, narrow), generator=g).double(),
        "all_equal": torch.full((2, wide), -0.5),
        "all_zero": torch.zeros(2, wide),
        "one_entry": torch.randn(5, 1, generator=g),
        "bfloat16": torch.randn(2, wide, generator=g).bfloat16(),
        "float64": torch.randn(2, wide, generator=g, dtype=torch.float64),
        "nan_and_inf": torch.where(
            torch.rand(2, wide, generator=g) < 0.05,
            torch.tensor([float("nan"), float("inf")]).repeat(wide // 2),
            torch.randn(2, wide, generator=g),
        ),
    }


INPUTS = _inputs()


# --- the hand case -----------------------------------------------------------------------


def test_hand_case_of_baselines_3_10_with_rho_one_half():
    """Hand case, ρ = 0.5: Δ1 = (0.5, −2, 0.1, 1) → (0, −4, 0, 2) and
    Δ2 = (1, 0.2, −0.3, 0) → (2, 0, −0.6, 0); their mean (1, −2, −0.3, 1) is the server
    update, against plain FedAvg's (0.75, −0.9, −0.1, 0.5)."""
    deltas = torch.tensor([[0.5, -2.0, 0.1, 1.0], [1.0, 0.2, -0.3, 0.0]], dtype=torch.float64)
    masked = feddea_mask(deltas, 0.5)
    assert masked.tolist() == [[0.0, -4.0, 0.0, 2.0], [2.0, 0.0, -0.6, 0.0]]
    torch.testing.assert_close(masked.mean(dim=0), torch.tensor([1.0, -2.0, -0.3, 1.0], dtype=torch.float64))
    torch.testing.assert_close(deltas.mean(dim=0), torch.tensor([0.75, -0.9, -0.1, 0.5], dtype=torch.float64))


def test_without_rescale_the_kept_entries_keep_their_values():
    """The ablation of [D]: the same mask, no 1/ρ."""
    deltas = torch.tensor([[0.5, -2.0, 0.1, 1.0], [1.0, 0.2, -0.3, 0.0]])
    assert feddea_mask(deltas, 0.5, rescale=False).tolist() == [
        [0.0, -2.0, 0.0, 1.0],
        [1.0, 0.0, pytest.approx(-0.3), 0.0],
    ]
    for name in ("random", "tied_few_values", "bfloat16"):
        _assert_same(
            feddea_mask(INPUTS[name], 0.3, rescale=False), _reference(INPUTS[name], 0.3, rescale=False)
        )


# --- exactly k, and the same set as a full sort --------------------------------------------


@pytest.mark.parametrize("rho", [0.1, 0.25, 0.5])
def test_exactly_k_entries_survive_when_values_tie(rho):
    """A `>=` threshold would keep every entry tied at the k-th magnitude; FedDEA keeps k.
    Entries are non-zero here, so the survivors are the non-zeros."""
    g = torch.Generator().manual_seed(0)
    for d in (10, 999, 60_003):
        ties = torch.randint(1, 3, (3, d), generator=g).float() * torch.sign(torch.randn(3, d, generator=g))
        masked = feddea_mask(ties, rho)
        assert torch.count_nonzero(masked, dim=1).tolist() == [feddea_k(rho, d)] * 3


def test_ties_at_the_threshold_go_to_the_lowest_indices():
    """The documented tie rule: (3, 1, 1, 1, 1, 2) with k = 3 keeps 3, 2 and the first 1."""
    masked = feddea_mask(torch.tensor([[3.0, 1.0, -1.0, 1.0, 1.0, 2.0]]), 0.5, rescale=False)
    assert masked.tolist() == [[3.0, 1.0, 0.0, 0.0, 0.0, 2.0]]


@pytest.mark.parametrize("rho", RHOS)
@pytest.mark.parametrize("name", list(INPUTS))
def test_equals_a_full_stable_sort(name, rho):
    """Random, heavily tied, all-equal, all-zero, one-entry, bfloat16/float64 and NaN/inf rows,
    narrow (exact selection) and wide (sampled interval): the same entries, the same values."""
    _assert_same(feddea_mask(INPUTS[name], rho), _reference(INPUTS[name], rho))


def test_more_nans_than_k_keeps_the_first_nans():
    """NaN is the largest magnitude (as in torch.sort); with more NaNs than k, the k of lowest
    index are kept and everything else is zeroed."""
    row = torch.tensor([[1.0, float("nan"), 5.0, float("nan"), float("nan"), 2.0]])
    masked = feddea_mask(row, 1 / 3, rescale=False)
    assert masked[0, [1, 3]].isnan().all() and torch.count_nonzero(masked[0, [0, 2, 4, 5]]) == 0


@pytest.mark.parametrize("where", ["above", "below", "narrow", "tiny_sample"])
def test_a_missed_sampled_interval_still_gives_the_exact_set(monkeypatch, where):
    """The sample only decides speed: an interval entirely above or below the k-th largest
    magnitude, one too narrow to hold the tied entries, or one from a 4-entry sample, all
    give the same result through the fallback selection."""
    if where == "tiny_sample":
        monkeypatch.setattr(feddea, "_SAMPLE_MAX", 4)
    else:
        bounds = {"above": lambda a: (1e30, 1e30), "below": lambda a: (0.0, 0.0)}
        bounds["narrow"] = lambda a: (1.0, 1.0) if a.max() == 2 else (5e-4, 5e-4)
        monkeypatch.setattr(feddea, "_sample_bounds", lambda a, k, g: bounds[where](a))
    for name in ("random", "tied_few_values", "nan_and_inf"):
        for rho in (0.01, 0.25, 0.9):
            _assert_same(feddea_mask(INPUTS[name], rho), _reference(INPUTS[name], rho))


def test_k_is_the_ceiling_of_rho_d_without_float_noise():
    """k = ⌈ρ·D⌉, at least 1; 0.3 · 10 is 3.0000000000000004 in floats but keeps 3 entries."""
    assert [feddea_k(0.25, d) for d in (1, 3, 4, 5, 8)] == [1, 1, 1, 2, 2]
    assert feddea_k(0.3, 10) == 3 and feddea_k(0.1, 10) == 1 and feddea_k(0.7, 10) == 7
    assert feddea_k(1e-9, 5) == 1 and feddea_k(0.25, 27_517_818) == math.ceil(27_517_818 / 4)
    assert feddea_k(0.5, 0) == 0


# --- ρ = 1, purity, shapes ---------------------------------------------------------------------


@pytest.mark.parametrize("rescale", [True, False])
def test_rho_one_is_a_bit_identical_copy(rescale):
    """ρ = 1 keeps everything unscaled: the bits of the input (−0.0 and NaN payloads included),
    in a new tensor."""
    updates = torch.cat([INPUTS["nan_and_inf"][:, :1000], torch.tensor([[-0.0], [0.0]])], dim=1)
    masked = feddea_mask(updates, 1.0, rescale=rescale)
    assert masked.data_ptr() != updates.data_ptr()
    assert torch.equal(masked.view(torch.int32), updates.view(torch.int32))


def test_the_input_is_not_modified():
    """feddea_mask works in its own output: the updates (and their bits) stay as they were."""
    for name in ("random", "tied_few_values", "bfloat16", "nan_and_inf"):
        updates = INPUTS[name].clone()
        feddea_mask(updates, 0.25)
        assert torch.equal(updates.view(torch.uint8), INPUTS[name].view(torch.uint8))


def test_non_contiguous_and_empty_inputs():
    """A transposed view is read as its rows; N = 0 or D = 0 gives an empty result."""
    base = INPUTS["random"][:, :40_000].T.contiguous()  # [40000, 3]
    view = base.T  # [3, 40000], not contiguous
    _assert_same(feddea_mask(view, 0.25), _reference(view.contiguous(), 0.25))
    assert feddea_mask(torch.empty(0, 5), 0.5).shape == (0, 5)
    assert feddea_mask(torch.empty(3, 0), 0.5).shape == (3, 0)


@pytest.mark.parametrize("rho", [0.0, -0.1, 1.5, float("nan"), float("inf"), True, "0.25"])
def test_bad_rho_names_algorithm_rho(rho):
    with pytest.raises(ValueError, match=r"algorithm\.rho must be a number in \(0, 1\]"):
        feddea_mask(torch.ones(2, 4), rho)


def test_non_floating_or_wrongly_shaped_updates_are_refused():
    with pytest.raises(ValueError, match=r"floating-point stack of updates \[N, D\]"):
        feddea_mask(torch.ones(2, 4, dtype=torch.int64), 0.5)
    with pytest.raises(ValueError, match=r"\[N, D\], got torch.float32 \(4,\)"):
        feddea_mask(torch.ones(4), 0.5)
