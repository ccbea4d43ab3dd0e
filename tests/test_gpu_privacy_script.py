"""benchmarks/gpu_privacy.py: every run it makes passes fedmtl fit's checks (the privacy
combinations, the ranges), so that a GPU lease is not spent on a refused config. No training."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from tests.helpers import load_script

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def script():
    yield load_script("benchmarks/gpu_privacy", register=True)  # its dataclasses look it up
    sys.modules.pop("gpu_privacy", None)


def _checked_config(script, variant, tmp: Path):
    """The variant's RunConfig after the checks fedmtl fit runs before it writes or trains
    (everything but the data and the model), on the CPU."""
    from fedmtl import cli
    from fedmtl.federated import preflight
    from fedmtl.federated.scenario import count_clients

    args = argparse.Namespace(accelerator="cpu", smoke=True, rounds=2)
    options = script.demo_options(args, tmp)
    scenario = script.gpu_rounds.Scenario(variant.name, ["configs/demo.yaml"], [*options, *variant.options])
    argv = script.gpu_rounds.fit_argv(scenario, variant.precision, tmp / "run")
    parser = cli._run_parser()
    cfg_ns = parser.parse_args(cli._check_config_files(argv)[1:])
    cfg_ns.pop("config", None)
    cfg = cli._instantiate(parser, cfg_ns)
    preflight.check_environment(cfg)
    cfg.algorithm.check_run(cfg.rounds, count_clients(cfg))
    return cli._privacy_rounds(cfg, count_clients(cfg))


def test_every_variant_passes_the_checks_and_has_its_baseline(script, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # configs/demo.yaml, as the script runs it
    configs = {variant.name: _checked_config(script, variant, tmp_path) for variant in script.VARIANTS}
    assert len(configs) == len(script.VARIANTS)  # no two variants share a name
    names = list(configs)
    for variant in script.VARIANTS:
        cfg = configs[variant.name]
        assert cfg.precision == variant.precision
        if variant.baseline is None:
            assert cfg.privacy.mode is None and not cfg.secure_aggregation
        else:  # its baseline comes first and differs by the privacy options alone
            assert names.index(variant.baseline) < names.index(variant.name)
            assert cfg.privacy.mode is not None
            base = configs[variant.baseline]
            assert type(base.algorithm) is type(cfg.algorithm) and base.model == cfg.model
    assert {cfg.privacy.mode for cfg in configs.values()} == {None, "central", "local", "sample"}
    assert not (tmp_path / "run").exists()


def test_bad_rounds_and_an_earlier_call_s_runs_are_refused_in_one_line(script, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the script moves to the checkout; this puts the test's folder back
    with pytest.raises(SystemExit) as stop:
        script.main(["--tmp", str(tmp_path), "--rounds", "0", "--accelerator", "cpu"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("error: --rounds must be at least 1")
    earlier = tmp_path / "privacy" / script.slug(script.VARIANTS[3])
    earlier.mkdir(parents=True)
    (earlier / "results.json").write_text("{}")
    with pytest.raises(SystemExit) as stop:
        script.main(["--tmp", str(tmp_path), "--accelerator", "cpu"])
    assert stop.value.code == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.endswith(
        f"error: --tmp {tmp_path} already holds {earlier} from an earlier call: give a new --tmp"
    )
    assert (earlier / "results.json").read_text() == "{}"
    assert not (tmp_path / "data").exists()  # stopped before generating anything
