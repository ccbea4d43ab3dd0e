"""Differential privacy and secure aggregation through the real engine, on the tiny scenario.

The privacy math itself (clipping, noise, the accountant, the ring) is tested on its own in
test_privacy_math.py, test_accounting.py and test_secagg.py; here: what a run does with it.
"""

from __future__ import annotations

import csv
import math

import pytest
import torch

from fedmtl.methods import METHODS
from fedmtl.privacy import secagg
from tests.helpers import (
    TINY_CLIENTS,
    client_states,
    fit,
    fit_in_processes,
    fit_killed_in_round,
    fit_refused,
    read_results,
    run_states,
    tiny_config,
)

NO_NOISE = ["--privacy.noise_multiplier", "0", "--privacy.clip", "inf"]
SUM_ONLY = [name for name in METHODS.names() if METHODS.get(name)().individual_updates is None]


def _same_states(a, b) -> None:
    for left, right in zip(a, b, strict=True):
        for key, tensor in left["model"].items():
            assert torch.equal(tensor, right["model"][key]), key


@pytest.mark.parametrize("name", METHODS.names())
def test_local_dp_with_no_noise_and_no_clip_is_the_run_without_privacy_bit_for_bit(
    method_run, tmp_path, name
):
    config, plain = method_run(name)
    results = fit(config, tmp_path / "private", "--privacy.mode", "local", *NO_NOISE)
    _same_states(client_states(plain), client_states(tmp_path / "private"))
    assert results["privacy"]["mode"] == "local"
    shares = bool(METHODS.get(name)().shared_parts)
    # z = 0: no guarantee at all (null: infinite), unless nothing ever leaves a client
    assert results["privacy"]["epsilon"] == (None if shares else 0.0)
    assert read_results(plain)["privacy"] is None


@pytest.mark.parametrize("name", ["FedAvg", "FedOpt", "FedDEA"])
def test_central_dp_and_secure_aggregation_with_no_noise_match_the_plain_run(method_run, tmp_path, name):
    config, plain = method_run(name)
    fit(config, tmp_path / "central", "--privacy.mode", "central", *NO_NOISE)
    _same_states(client_states(plain), client_states(tmp_path / "central"))
    # Secure aggregation: round 1's sums up to the ring's fixed-point rounding (later rounds
    # train on that rounding, and drift further).
    fit(config, tmp_path / "secure", "--secure_aggregation", "true", "--rounds", "1")
    # The largest group summed: FedAvg's 4 decoders (3 clients, NYUD's two tasks) as one pool,
    # + float32's rounding of the mean.
    bound = secagg.quantisation_bound(4) + 1e-6
    round_1 = run_states(plain, plain / "checkpoints" / "round_0001")[:TINY_CLIENTS]
    differ = 0
    for left, right in zip(round_1, client_states(tmp_path / "secure"), strict=True):
        for key, tensor in left["model"].items():
            error = float((tensor.double() - right["model"][key].double()).abs().max())
            assert error <= bound, (key, error)
            differ += error > 0
    assert differ > 0  # the sums did go through the ring


# --- one noisy run: the same noise on 1 and 2 devices and after a resume -------------------

NOISY = {
    "privacy": {
        "mode": "central",
        "noise_multiplier": 0.5,
        "clip": 0.5,
        "adaptive_clip": {"enabled": True, "count_stddev": 1.0},
    },
    "secure_aggregation": True,
}


@pytest.fixture(scope="module")
def noisy(module_dir, data_root):
    """FedAvg under central DP with adaptive clipping and secure aggregation, 3 rounds."""
    config = tiny_config(
        module_dir, data_root, name="noisy.yaml", algorithm={"class_path": "FedAvg"}, **NOISY
    )
    fit(config, module_dir / "noisy")
    return config, module_dir / "noisy"


def test_central_dp_logs_epsilon_every_round_and_writes_it_to_results(noisy):
    _, run = noisy
    block = read_results(run)["privacy"]
    assert block["mode"] == "central" and block["secure_aggregation"] is True
    assert block["rounds_accounted"] == 3 and block["delta"] == 1e-5 and block["adaptive_clip"] is True
    with (run / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))  # round,key,value
    epsilons = [float(r["value"]) for r in rows if r["key"] == "privacy/epsilon"]
    assert len(epsilons) == 3 and epsilons == sorted(epsilons) and epsilons[0] > 0
    assert math.isclose(epsilons[-1], block["epsilon"], rel_tol=1e-9)
    clips = [float(r["value"]) for r in rows if r["key"] == "privacy/clip"]
    assert len(set(clips)) == 3 and math.isclose(clips[-1], block["final_clip"])  # adapted every round


def test_the_noise_is_the_same_on_two_devices(noisy, tmp_path):
    config, one = noisy
    fit_in_processes(config, tmp_path / "two", devices=2)
    _same_states(client_states(one), client_states(tmp_path / "two"))
    assert read_results(one)["privacy"] == read_results(tmp_path / "two")["privacy"]


def test_the_noise_is_the_same_after_a_resume(noisy, tmp_path, monkeypatch):
    config, one = noisy
    killed = tmp_path / "killed"
    fit_killed_in_round(config, killed, monkeypatch, 3)
    fit(config, killed, "--resume", "true")
    _same_states(client_states(one), client_states(killed))
    assert read_results(one)["privacy"] == read_results(killed)["privacy"]


def test_local_noise_changes_what_the_server_sees(method_run, tmp_path):
    config, plain = method_run("FedAvg")
    # z·C = 20 per entry: far beyond update_norm_limit's 10x growth, which reads the update as
    # trained (deliberate noise is no divergence): nothing is dropped.
    fit(config, tmp_path / "local", "--privacy.mode", "local", "--privacy.noise_multiplier", "20")
    with (tmp_path / "local" / "metrics.csv").open() as f:
        dropped = [float(r["value"]) for r in csv.DictReader(f) if r["key"] == "server/dropped_updates"]
    assert dropped == [0.0, 0.0]
    states = client_states(tmp_path / "local")
    encoder = [
        k
        for k in states[0]["model"]
        if k.startswith("encoder.") and states[0]["model"][k].is_floating_point()
    ]
    assert any(not torch.equal(client_states(plain)[0]["model"][k], states[0]["model"][k]) for k in encoder)
    # FedAvg gives every client the same encoder: the noisy mean
    assert all(
        torch.equal(states[0]["model"][k], states[1]["model"][k])
        for k in encoder
        if "running" not in k and "num_batches" not in k
    )


# --- refusals: one line, nothing written ---------------------------------------------------


@pytest.mark.parametrize(
    ("algorithm", "extra", "expected"),
    [
        (
            "FedHCA2",
            ["--privacy.mode", "central", "--privacy.noise_multiplier", "1"],
            "error: privacy.mode central adds noise to the server's sums of updates, but FedHCA2 weighs each "
            "decoder by cross-attention",
        ),
        (
            "FedAMP",
            ["--secure_aggregation", "true"],
            "error: secure_aggregation: the server would see only the sums of updates, but FedAMP weighs every "
            "pair of clients",
        ),
        (
            "MaTFL",
            ["--secure_aggregation", "true"],
            "error: secure_aggregation: the server would see only the sums of updates, but MaTFL clusters",
        ),
        (
            "FedAvg",
            [
                "--privacy.mode",
                "local",
                "--privacy.noise_multiplier",
                "1",
                "--privacy.adaptive_clip.enabled",
                "true",
            ],
            "error: privacy.adaptive_clip needs a trusted server",
        ),
        (
            "FedAvg",
            [
                "--privacy.mode",
                "central",
                "--privacy.noise_multiplier",
                "0.1",
                "--privacy.target_epsilon",
                "0.5",
            ],
            "error: privacy.target_epsilon 0.5 is spent by round 1 alone",
        ),
        (
            "FedAvg",
            ["--privacy.mode", "sample", "--privacy.noise_multiplier", "1", "--precision", "bf16-mixed"],
            "error: privacy.mode sample (DP-SGD) trains in full precision, but precision is bf16-mixed",
        ),
    ],
)
def test_a_bad_privacy_combination_is_one_line_before_anything_is_written(
    tmp_path, data_root, capsys, algorithm, extra, expected
):
    config = tiny_config(tmp_path, data_root, algorithm={"class_path": algorithm})
    lines = fit_refused(config, tmp_path / "run", capsys, *extra)
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            ["--privacy.noise_multiplier", "-1"],
            "error: privacy.noise_multiplier must be a finite number >= 0, got -1.0",
        ),
        (["--privacy.clip", "0"], "error: privacy.clip must be > 0 (inf: no clipping), got 0.0"),
        (["--privacy.delta", "1"], "error: privacy.delta must be in (0, 1), got 1.0"),
        (
            ["--privacy.target_epsilon", "0"],
            "error: privacy.target_epsilon must be a finite number > 0, got 0.0",
        ),
        (["--privacy.mode", "local"], "error: privacy.mode is local but neither privacy.noise_multiplier"),
        (
            ["--privacy.mode", "local", "--privacy.noise_multiplier", "1", "--privacy.clip", "inf"],
            "error: privacy.clip is inf but the noise multiplier is 1.0",
        ),
        (
            ["--privacy.adaptive_clip.target_quantile", "1.5"],
            "error: privacy.adaptive_clip.target_quantile must be in [0, 1], got 1.5",
        ),
        (
            ["--privacy.adaptive_clip.clip_lr", "0"],
            "error: privacy.adaptive_clip.clip_lr must be a finite number > 0, got 0.0",
        ),
        (
            ["--privacy.adaptive_clip.count_stddev", "-2"],
            "error: privacy.adaptive_clip.count_stddev must be a finite number > 0, got -2.0",
        ),
        (
            [
                "--privacy.mode",
                "sample",
                "--privacy.noise_multiplier",
                "1",
                "--privacy.adaptive_clip.enabled",
                "true",
            ],
            "error: privacy.adaptive_clip is for client-level DP",
        ),
    ],
)
def test_every_privacy_field_is_range_checked_in_one_line(tmp_path, data_root, capsys, extra, expected):
    lines = fit_refused(tiny_config(tmp_path, data_root), tmp_path / "run", capsys, *extra)
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    assert not (tmp_path / "run").exists()


# --- a target ε ------------------------------------------------------------------------------


def test_target_epsilon_alone_derives_the_noise_and_stays_within_it(tmp_path, data_root):
    config = tiny_config(tmp_path, data_root, algorithm={"class_path": "FedAvg"}, rounds=2)
    extra = ["--privacy.mode", "local", "--privacy.target_epsilon", "8", "--privacy.clip", "1"]
    block = fit(config, tmp_path / "run", *extra)["privacy"]
    assert block["noise_multiplier_derived"] is True and block["noise_multiplier"] > 0
    assert block["epsilon"] <= 8 and block["epsilon"] > 7  # the smallest z: ε close to the target


def test_a_run_with_noise_and_a_target_stops_at_the_last_round_within_it(tmp_path, data_root, capsys):
    from fedmtl.privacy.accounting import epsilon

    config = tiny_config(tmp_path, data_root, algorithm={"class_path": "FedAvg"}, rounds=3)
    target = (epsilon(1.0, 1.0, 2, 1e-5) + epsilon(1.0, 1.0, 3, 1e-5)) / 2  # between rounds 2 and 3
    extra = [
        "--privacy.mode",
        "local",
        "--privacy.noise_multiplier",
        "1",
        "--privacy.target_epsilon",
        str(target),
    ]
    results = fit(config, tmp_path / "run", *extra)
    assert results["rounds"] == 2
    assert results["privacy"]["stopped_at_target"] is True and results["privacy"]["rounds_planned"] == 3
    assert results["privacy"]["epsilon"] <= target
    assert "privacy: ε would pass target_epsilon" in capsys.readouterr().err


# --- DP-SGD (mode sample) -------------------------------------------------------------------

SAMPLE = ["--privacy.mode", "sample", "--privacy.noise_multiplier", "1.0", "--privacy.clip", "1.0"]


def test_dp_sgd_refuses_a_batch_norm_model_in_one_line_before_anything_is_written(
    tmp_path, data_root, capsys
):
    lines = fit_refused(tiny_config(tmp_path, data_root), tmp_path / "run", capsys, *SAMPLE)
    assert len(lines) == 1 and lines[0].startswith(
        "error: DP-SGD (privacy.mode sample) cannot train this model"
    )
    assert "set model.norm: group" in lines[0]
    assert not (tmp_path / "run").exists()


def test_dp_sgd_trains_a_group_norm_model_and_accounts_each_client(tmp_path, data_root):
    config = tiny_config(tmp_path, data_root, algorithm={"class_path": "FedAvg"}, rounds=2)
    results = fit(config, tmp_path / "run", *SAMPLE, "--model.norm", "group")
    block = results["privacy"]
    assert block["mode"] == "sample" and block["epsilon"] > 0 and math.isfinite(block["epsilon"])
    from fedmtl.privacy.accounting import epsilon

    # The worst client: 12 PASCAL images split over 2 clients at batch 4 (q = 4/6, 1 step an
    # epoch, 1 epoch a round) or NYUD's 12 at batch 4 (q = 1/3, 3 steps, 2 epochs a round).
    expected = max(epsilon(1.0, 4 / 6, 1 * 2, 1e-5), epsilon(1.0, 1 / 3, 3 * 2 * 2, 1e-5))
    assert math.isclose(block["epsilon"], expected, rel_tol=1e-9)
