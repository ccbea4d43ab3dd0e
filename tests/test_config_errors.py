"""Every out-of-range config value is refused when the config is read, with one ``error:`` line
that names the field by its config path (and the fix where it is not obvious), before anything
is written; and ``fedmtl fit --help`` describes every field."""

from __future__ import annotations

import pytest

from tests.helpers import TINY, fit_refused, tiny_config

PASCAL, NYUD = TINY["clients"]


def _group(**changes) -> dict:
    """The tiny scenario's clients with ``changes`` in the NYUD-v2 group."""
    return {"clients": [PASCAL, {**NYUD, **changes}]}


def _optimizer(**changes) -> dict:
    return _group(optimizer=changes)


def _partition(name: str, **options) -> dict:
    """The tiny scenario's data with ``data.partition`` NAME(**options)."""
    return {"data": {**TINY["data"], "partition": {"class_path": name, "init_args": options}}}


def _partition_args(name: str, **options: str) -> list[str]:
    """``--data.partition NAME --data.partition.OPTION VALUE ...``"""
    return ["--data.partition", name, *(a for k, v in options.items() for a in (f"--data.partition.{k}", v))]


# data.partition options: (partition, option, value, YAML changes, command-line overrides, fix)
PARTITION_REFUSED = [
    (
        "Dirichlet",
        "alpha",
        0,
        {},
        _partition_args("Dirichlet", alpha="0"),
        "got 0.0 (smaller: more label skew",
    ),
    ("Dirichlet", "alpha", "nan", _partition("Dirichlet", alpha=float("nan")), [], "got nan"),
    ("Dirichlet", "alpha", "inf", _partition("Dirichlet", alpha=float("inf")), [], "got inf"),
    ("Quantity", "alpha", -1, {}, _partition_args("Quantity", alpha="-1"), "smaller: more uneven sizes"),
    ("Quantity", "exponent", 0, {}, _partition_args("Quantity", exponent="0"), "larger: more uneven sizes"),
    (
        "Quantity",
        "distribution",
        "zipf",
        {},
        _partition_args("Quantity", distribution="zipf"),
        "must be dirichlet or power_law, got 'zipf'",
    ),
    (
        "Shards",
        "shards_per_client",
        0,
        {},
        _partition_args("Shards", shards_per_client="0"),
        "integer >= 1, got 0",
    ),
]


# (YAML changes, command-line overrides, the field the error line starts with, a part of the fix)
REFUSED = {
    "rounds 0": ({}, ["--rounds", "0"], "rounds", "got 0"),
    "evaluation.every -1": (
        {},
        ["--evaluation.every", "-1"],
        "evaluation.every",
        "0: evaluate after the last",
    ),
    "evaluation.clients 0": ({}, ["--evaluation.clients", "0"], "evaluation.clients", "null: every client"),
    "evaluation.batch_size 0": ({}, ["--evaluation.batch_size", "0"], "evaluation.batch_size", "got 0"),
    "update_norm_limit 1": ({}, ["--update_norm_limit", "1"], "update_norm_limit", "null: no check"),
    "update_norm_limit nan": ({"update_norm_limit": float("nan")}, [], "update_norm_limit", "got nan"),
    "checkpoint_every -1": (
        {},
        ["--checkpoint_every", "-1"],
        "checkpoint_every",
        "0: a checkpoint after the",
    ),
    "devices 0": ({}, ["--devices", "0"], "devices", "got 0"),
    "num_nodes 0": ({}, ["--num_nodes", "0"], "num_nodes", "got 0"),
    "cpu_threads 0": ({}, ["--cpu_threads", "0"], "cpu_threads", "or null"),
    "seed -1": ({}, ["--seed", "-1"], "seed", "got -1"),
    "seed 2**32": ({}, ["--seed", str(2**32)], "seed", "[0, 4294967295]"),
    "accelerator tpu": ({}, ["--accelerator", "tpu"], "accelerator", "auto, cpu, cuda, gpu, mps"),
    "clients []": ({"clients": []}, [], "clients", "at least one client group"),
    "model.embed_dim 0": ({}, ["--model.embed_dim", "0"], "model.embed_dim", "or null"),
    "data.num_workers -1": ({}, ["--data.num_workers", "-1"], "data.num_workers", "got -1"),
    "data.cache_mib -1": ({}, ["--data.cache_mib", "-1"], "data.cache_mib", "(0: no cache)"),
    "data.cache_mib with loader workers": (
        {},
        ["--data.cache_mib", "64", "--data.num_workers", "2"],
        "data.cache_mib",
        "set data.num_workers to 0",
    ),
    "data.train_size 16x32": ({}, ["--data.train_size", "[16, 32]"], "data.train_size", "or null"),
    "data.scale_range max < min": (
        {},
        ["--data.scale_range", "[2.0, 0.5]"],
        "data.scale_range",
        "[1.0, 1.0] turns the rescaling off",
    ),
    "data.scale_range 0": ({}, ["--data.scale_range", "[0.0, 1.0]"], "data.scale_range", "0 < min <= max"),
    "data.human_parts_selection paper": (
        {},
        ["--data.human_parts_selection", "paper"],
        "data.human_parts_selection",
        "must be correct or public, got 'paper': correct (the default) keeps",
    ),
    **{
        f"data.partition.{option} {value} ({name})": (changes, args, f"data.partition.{option}", fix)
        for name, option, value, changes, args, fix in PARTITION_REFUSED
    },
    "data.synth num_train 0": (
        {},
        ["--data.synth", '{"nyud": {"num_train": 0}}'],
        "data.synth.nyud.num_train",
        "got 0",
    ),
    "data.synth num_val 0": ({}, ["--data.synth", '{"nyud": {"num_val": 0}}'], "data.synth.nyud.num_val", ""),
    "data.synth size 8x96": ({}, ["--data.synth", '{"nyud": {"size": [8, 96]}}'], "data.synth.nyud.size", ""),
    "data.synth seed -1": ({}, ["--data.synth", '{"nyud": {"seed": -1}}'], "data.synth.nyud.seed", ""),
    "availability.dropout 1": (
        {},
        ["--availability.dropout", "1"],
        "availability.dropout",
        "[0, 1), got 1.0",
    ),
    "availability.dropout -0.1": (
        {},
        ["--availability.dropout", "-0.1"],
        "availability.dropout",
        "0: every client is always available",
    ),
    "availability.dropout nan": (
        {"availability": {"dropout": float("nan")}},
        [],
        "availability.dropout",
        "got nan",
    ),
    "availability.stragglers 1.5": (
        {},
        ["--availability.stragglers", "1.5"],
        "availability.stragglers",
        "[0, 1], got 1.5: the probability",
    ),
    "availability.straggler_work 0": (
        {},
        ["--availability.straggler_work", "0"],
        "availability.straggler_work",
        "(0, 1], got 0.0: the part of each local epoch",
    ),
    "availability.straggler_work 1.5": (
        {},
        ["--availability.straggler_work", "1.5"],
        "availability.straggler_work",
        "1: the whole epoch",
    ),
    "clients[].tasks []": (_group(tasks=[]), [], "clients[].tasks", "'nyud' client group"),
    "clients[].replicas 0": (_group(replicas=0), [], "clients[].replicas", "'nyud' client group"),
    "clients[].local_epochs 0": (_group(local_epochs=0), [], "clients[].local_epochs", "'nyud' client group"),
    "clients[].batch_size 0": (_group(batch_size=0), [], "clients[].batch_size", "'nyud' client group"),
    "clients[].loss_shards 0": (_group(loss_shards=0), [], "clients[].loss_shards", "'nyud' client group"),
    "clients[].tasks_per_client 0": (
        _group(tasks_per_client=0),
        [],
        "clients[].tasks_per_client",
        "between 1 and the group's 2 tasks, got 0",
    ),
    "clients[].tasks_per_client 3 of 2": (
        _group(tasks_per_client=3),
        [],
        "clients[].tasks_per_client",
        "(or null: every client learns all of them)",
    ),
    "clients[].tasks_per_client in a single-task group": (
        _group(tasks_per_client=1, single_task=True),
        [],
        "clients[].tasks_per_client",
        "needs single_task: false",
    ),
    "every client group held out": (
        {"clients": [{**PASCAL, "held_out": True}, {**NYUD, "held_out": True}]},
        [],
        "clients",
        "set held_out false on at least one group",
    ),
    "clients[].fine_tune_epochs without held_out": (
        _group(fine_tune_epochs=1),
        [],
        "clients[].fine_tune_epochs",
        "needs held_out: true",
    ),
    "clients[].fine_tune_epochs -1": (
        _group(held_out=True, fine_tune_epochs=-1),
        [],
        "clients[].fine_tune_epochs",
        "(0: no fine-tuning)",
    ),
    "clients[].loss_shards not dividing the batch": (
        _group(batch_size=8, loss_shards=3),
        [],
        "clients[].loss_shards",
        "must divide clients[].batch_size (8)",
    ),
    "optimizer.lr -1": (_optimizer(lr=-1.0), [], "clients[].optimizer.lr", "got -1.0"),
    "optimizer.lr 0": (_optimizer(lr=0.0), [], "clients[].optimizer.lr", "got 0.0"),
    "optimizer.lr nan": (_optimizer(lr=float("nan")), [], "clients[].optimizer.lr", "got nan"),
    "optimizer.weight_decay -1": (_optimizer(weight_decay=-1.0), [], "clients[].optimizer.weight_decay", ""),
    "optimizer.warmup_epochs -1": (_optimizer(warmup_epochs=-1), [], "clients[].optimizer.warmup_epochs", ""),
    "optimizer.warmup_lr -1": (_optimizer(warmup_lr=-1.0), [], "clients[].optimizer.warmup_lr", ""),
    "optimizer.min_lr -1": (_optimizer(min_lr=-1.0), [], "clients[].optimizer.min_lr", ""),
    "optimizer.keep_state null": (
        _optimizer(keep_state=None),
        [],
        "clients[].optimizer.keep_state",
        "true or false, got None: true keeps",
    ),
    "optimizer.min_lr above lr": (
        _optimizer(lr=1e-4, min_lr=1e-3),
        [],
        "clients[].optimizer.min_lr",
        "lower min_lr or raise lr",
    ),
}

FEDHCA2_REFUSED = {
    "alpha_init 1.5": (["--algorithm.alpha_init", "1.5"], "algorithm.alpha_init", "only on [0, 1]"),
    "alpha_init -0.1": (["--algorithm.alpha_init", "-0.1"], "algorithm.alpha_init", "never learn"),
    "beta_init 1.5": (["--algorithm.beta_init", "1.5"], "algorithm.beta_init", "only on [0, 1]"),
    "c 1": (["--algorithm.c", "1"], "algorithm.c", "[0, 1)"),
    "hyper_lr 0": (["--algorithm.hyper_lr", "0"], "algorithm.hyper_lr", "must be > 0"),
    "hyper_momentum 1": (["--algorithm.hyper_momentum", "1"], "algorithm.hyper_momentum", "[0, 1)"),
    "hyper_weight_decay -1": (
        ["--algorithm.hyper_weight_decay", "-1"],
        "algorithm.hyper_weight_decay",
        ">= 0",
    ),
}


def _the_one_error_line(lines: list[str]) -> str:
    """stderr holds exactly one line, the ``error:`` line (no traceback, no usage)."""
    assert len([line for line in lines if line.startswith("error:")]) == 1, lines
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("changes, overrides, field, fix", REFUSED.values(), ids=REFUSED.keys())
def test_an_out_of_range_value_is_refused_with_one_line_naming_its_field(
    tmp_path, data_root, capsys, changes, overrides, field, fix
):
    """The checks run when the config is instantiated, so a bad value costs no data generation,
    no model building and no file in the run directory."""
    config = tiny_config(tmp_path, data_root, **changes)
    line = _the_one_error_line(fit_refused(config, tmp_path / "run", capsys, *overrides))
    assert line.startswith(f"error: {field} "), line
    assert fix in line


def test_a_switch_that_is_not_true_or_false_is_refused_with_one_line_naming_it(tmp_path, data_root, capsys):
    """A bool field (here evaluation.edge_thin_gt) takes true or false only; jsonargparse's line
    names the key and the type."""
    config = tiny_config(tmp_path, data_root)
    lines = fit_refused(config, tmp_path / "run", capsys, "--evaluation.edge_thin_gt", "maybe")
    line = _the_one_error_line(lines)
    assert '"evaluation.edge_thin_gt"' in line and "bool" in line and "maybe" in line, line


def test_a_client_switch_that_is_not_true_or_false_is_refused_with_one_line_naming_it(
    tmp_path, data_root, capsys
):
    """clients[].optimizer.keep_state 1 in a config file: jsonargparse's line names the key and
    the type (null, which it lets through, is refused by OptimizerConfig: REFUSED above)."""
    config = tiny_config(tmp_path, data_root, **_optimizer(keep_state=1))
    line = _the_one_error_line(fit_refused(config, tmp_path / "run", capsys))
    assert '"optimizer.keep_state"' in line and "bool" in line and "1" in line, line


@pytest.mark.parametrize("value", [1, "yes", None])
def test_optimizer_config_refuses_a_keep_state_that_is_not_a_bool(value):
    """Python callers, which jsonargparse does not check, get the same one-line message."""
    from fedmtl.config import OptimizerConfig

    with pytest.raises(
        ValueError, match=r"^clients\[\]\.optimizer\.keep_state must be true or false, got "
    ) as error:
        OptimizerConfig(keep_state=value)
    assert "\n" not in str(error.value) and "fresh AdamW every round" in str(error.value)


@pytest.mark.parametrize("overrides, field, fix", FEDHCA2_REFUSED.values(), ids=FEDHCA2_REFUSED.keys())
def test_an_out_of_range_fedhca2_option_is_refused_with_one_line_naming_it(
    tmp_path, data_root, capsys, overrides, field, fix
):
    """A hyper weight initialised outside [0, 1] would never learn (its gradient is passed only
    on [0, 1]): a silent no-op that is refused instead."""
    config = tiny_config(tmp_path, data_root)
    lines = fit_refused(config, tmp_path / "run", capsys, "--algorithm", "FedHCA2", *overrides)
    line = _the_one_error_line(lines)
    assert line.startswith(f"error: {field} "), line
    assert fix in line


def test_the_boundary_values_are_accepted(tmp_path, data_root):
    """Every check is inclusive where the documentation says so: 0 evaluations / checkpoints
    between rounds (only at the end), cpu_threads null, min_lr equal to lr, no warm-up, hyper
    weights at exactly 0 and 1, the smallest sizes."""
    from fedmtl.cli import _run_parser
    from fedmtl.config import RunConfig

    boundary = _group(replicas=1, local_epochs=1, batch_size=1)
    boundary["clients"][1]["optimizer"] = {"lr": 1e-3, "min_lr": 1e-3, "warmup_epochs": 0, "warmup_lr": 0.0}
    parser = _run_parser()
    cfg_ns = parser.parse_args(
        [
            *("--config", str(tiny_config(tmp_path, data_root, **boundary))),
            *("--rounds", "1", "--evaluation.every", "0", "--evaluation.batch_size", "1"),
            *("--checkpoint_every", "0", "--cpu_threads", "null", "--seed", str(2**32 - 1)),
            *("--data.train_size", "[32, 32]", "--data.num_workers", "0", "--model.embed_dim", "1"),
            *("--data.cache_mib", "0", "--availability.dropout", "0", "--availability.stragglers", "1"),
            *("--availability.straggler_work", "1"),
            *("--data.synth", '{"nyud": {"num_train": 1, "num_val": 1, "size": [16, 16], "seed": 0}}'),
            *("--algorithm", "FedHCA2", "--algorithm.alpha_init", "0", "--algorithm.beta_init", "1"),
            *("--algorithm.c", "0", "--algorithm.hyper_momentum", "0", "--algorithm.hyper_weight_decay", "0"),
            *("--accelerator", "CPU"),  # any case, as Lightning reads it
        ]
    )
    cfg_ns.pop("config")
    cfg = RunConfig.from_namespace(parser.instantiate(cfg_ns))
    assert (cfg.evaluation.every, cfg.checkpoint_every, cfg.cpu_threads) == (0, 0, None)
    assert cfg.clients[1].optimizer.min_lr == cfg.clients[1].optimizer.lr
    assert (cfg.algorithm.alpha_init, cfg.algorithm.beta_init) == (0.0, 1.0)
    assert (cfg.availability.dropout, cfg.availability.stragglers, cfg.availability.straggler_work) == (
        0,
        1,
        1,
    )


@pytest.mark.parametrize("name", ["scenario1.yaml", "scenario2.yaml", "demo.yaml"])
def test_the_shipped_configs_pass_every_check(name):
    """The checks refuse no value a shipped config uses."""
    from fedmtl.cli import _run_parser
    from fedmtl.config import RunConfig
    from tests.test_configs import CONFIGS

    parser = _run_parser()
    cfg = RunConfig.from_namespace(parser.instantiate(parser.parse_path(str(CONFIGS / name))))
    assert cfg.rounds >= 1 and cfg.clients


def test_fit_help_describes_the_fields(capsys):
    """The descriptions live in the dataclasses' ``Attributes:`` sections, which jsonargparse
    prints; a ``#`` comment it cannot read would leave only the type and default."""
    from fedmtl.cli import main

    with pytest.raises(SystemExit) as done:
        main(["fit", "--help"])
    assert done.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
    for described in [
        "--rounds ROUNDS federated rounds (at least 1).",
        "--cpu_threads CPU_THREADS torch threads per process on CPU; null: the cores divided among the local",
        "--nonfinite {drop,stop} a client update with NaN/inf: drop it (the client keeps its previous state;",
        "--model.pretrained_strict {true,false} true: every encoder tensor must be in pretrained_file",
        "--evaluation.every EVERY rounds between evaluations on the full validation set;",
        "--evaluation.edge_thin_gt {true,false} edge odsF matches against the thinned ground-truth boundary,",
        "--data.train_size TRAIN_SIZE training crop and evaluation padding [height, width],",
        "--data.scale_range [ITEM,...] [min, max] of the training augmentation's random rescaling,",
        "--data.cache_mib CACHE_MIB MiB of decoded samples (training and validation, before augmentation)",
        "--model.channels_last {true,false} the channels-last memory layout for weights and inputs:",
        "--update_norm_limit UPDATE_NORM_LIMIT a client update that moves a part of its model",
        "how the clients of a dataset split its training images, by name (--data.partition Dirichlet",
        "--availability.dropout DROPOUT probability that a client that would train in a round",
        "--availability.stragglers STRAGGLERS probability that an available training client straggles",
        "--availability.straggler_work STRAGGLER_WORK the part of each local epoch a straggler trains:",
    ]:
        assert described in help_text
