"""benchmarks/gpu_privacy.py: every run it makes passes fedmtl fit's checks (the privacy
combinations, the ranges), so that a GPU lease is not spent on a refused config. No training."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("gpu_privacy", REPO / "benchmarks" / "gpu_privacy.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


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
    names = [variant.name for variant in script.VARIANTS]
    assert len(set(names)) == len(names)
    modes = set()
    for variant in script.VARIANTS:
        cfg = _checked_config(script, variant, tmp_path)
        assert cfg.precision == variant.precision
        modes.add(cfg.privacy.mode)
        if variant.baseline is None:
            assert cfg.privacy.mode is None and not cfg.secure_aggregation
        else:  # its baseline comes first and differs by the privacy options alone
            assert names.index(variant.baseline) < names.index(variant.name)
            assert cfg.privacy.mode is not None
            base = _checked_config(script, script.VARIANTS[names.index(variant.baseline)], tmp_path)
            assert type(base.algorithm) is type(cfg.algorithm) and base.model == cfg.model
    assert modes == {None, "central", "local", "sample"}
    assert not (tmp_path / "run").exists()
