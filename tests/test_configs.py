"""The shipped configs parse into the scenarios the paper describes."""

from pathlib import Path

import pytest

from fedmtl.cli import _run_parser

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def _load(name: str):
    parser = _run_parser()
    return parser.instantiate(parser.parse_path(str(CONFIGS / name)))


@pytest.mark.parametrize(
    "name, clients",
    [
        ("scenario1.yaml", [("pascal_context", True, 1, 5), ("nyud", False, 4, 4)]),
        ("scenario2.yaml", [("nyud", True, 4, 4), ("pascal_context", False, 1, 5)]),
        ("demo.yaml", [("pascal_context", True, 1, 5), ("nyud", False, 4, 4)]),
    ],
)
def test_configs_describe_the_paper_scenarios(name, clients):
    cfg = _load(name)
    assert [(g.dataset, g.single_task, g.local_epochs, len(g.tasks)) for g in cfg.clients] == clients
    assert all(g.batch_size == 8 for g in cfg.clients)


@pytest.mark.parametrize("name", ["scenario1.yaml", "scenario2.yaml"])
def test_paper_scenarios_use_the_paper_recipe(name):
    cfg = _load(name)
    assert cfg.model.backbone == "swin_t" and cfg.rounds == 100 and cfg.evaluation.every == 4
    assert cfg.data.train_size is None  # the paper's sizes
    assert all(g.optimizer.lr == 1e-4 and g.optimizer.weight_decay == 1e-4 for g in cfg.clients)


@pytest.mark.parametrize("name", ["scenario1.yaml", "scenario2.yaml", "demo.yaml"])
def test_paper_runs_and_the_demo_use_fedhca2_with_the_paper_settings(name):
    algorithm = _load(name).algorithm
    assert type(algorithm).__name__ == "FedHCA2"
    assert (algorithm.c, algorithm.alpha_init, algorithm.beta_init, algorithm.hyper_lr) == (
        0.4,
        0.1,
        0.1,
        0.01,
    )
    assert (algorithm.encoder, algorithm.decoder) == ("conflict_averse", "cross_attention")


@pytest.mark.parametrize(
    "ablation, schemes",
    [("encoder_only.yaml", ("conflict_averse", "none")), ("decoder_only.yaml", ("none", "cross_attention"))],
)
def test_the_ablation_is_one_more_config_file(ablation, schemes):
    parser = _run_parser()
    cfg = parser.parse_args(
        ["--config", str(CONFIGS / "scenario1.yaml"), "--config", str(CONFIGS / "ablation" / ablation)]
    )
    algorithm = parser.instantiate(cfg).algorithm
    assert (algorithm.encoder, algorithm.decoder) == schemes
    assert algorithm.c == 0.4 and cfg.rounds == 100


@pytest.mark.parametrize(
    "name, dataset, tasks",
    [
        ("feddea/nyud.yaml", "nyud", 4),
        ("feddea/pascal.yaml", "pascal_context", 5),
        ("feddea/demo.yaml", "pascal_context", 5),
    ],
)
def test_feddea_unified_configs_give_one_task_per_client_and_share_decoders_and_heads(name, dataset, tasks):
    cfg = _load(name)
    ((group,),) = [cfg.clients]
    assert (group.dataset, group.single_task, len(group.tasks), group.replicas) == (dataset, True, tasks, 1)
    algorithm = cfg.algorithm
    assert type(algorithm).__name__ == "FedDEA" and algorithm.rho == 0.25 and algorithm.scope == "unit"
    host = algorithm.host
    assert type(host).__name__ == "FedAvg" and algorithm.shares_heads
    assert (host.encoder_scope, host.decoder_scope, host.head_scope) == ("all", "same_task", "same_task")


def test_feddea_demo_reads_the_demo_data():
    demo, unified = _load("demo.yaml"), _load("feddea/demo.yaml")
    assert unified.data.root == demo.data.root and unified.data.synth == demo.data.synth


@pytest.mark.parametrize("name, method", [("feddea.yaml", "FedDEA"), ("fedopt.yaml", "FedOpt")])
def test_method_fragments_of_feddea_and_fedopt(name, method):
    parser = _run_parser()
    cfg = parser.instantiate(
        parser.parse_args(
            ["--config", str(CONFIGS / "scenario1.yaml"), "--config", str(CONFIGS / "methods" / name)]
        )
    )
    assert type(cfg.algorithm).__name__ == method and not cfg.algorithm.shares_heads
