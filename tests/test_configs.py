"""The shipped configs parse into the scenarios the paper describes."""

import os
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


# The paper's variants (configs/variants/): (dataset, single_task, replicas, local_epochs, tasks)
# per client group, and how many clients that makes.
PASCAL = ["semseg", "human_parts", "sal", "normals", "edge"]
NYUD = ["semseg", "normals", "edge", "depth"]


@pytest.mark.parametrize(
    "name, groups, clients",
    [
        ("scenario1_2c.yaml", [("pascal_context", True, 2, 1, PASCAL), ("nyud", False, 2, 4, NYUD)], 12),
        ("scenario1_4c.yaml", [("pascal_context", True, 4, 1, PASCAL), ("nyud", False, 4, 4, NYUD)], 24),
        ("nyud_st.yaml", [("nyud", True, 1, 4, NYUD)], 4),
        ("pascal_st.yaml", [("pascal_context", True, 1, 1, PASCAL)], 5),
        (
            "mt_only.yaml",
            [
                ("pascal_context", False, 1, 1, ["semseg", "human_parts", "normals"]),
                ("nyud", False, 1, 4, ["semseg", "normals"]),
            ],
            2,
        ),
    ],
)
def test_the_paper_variants_are_configs(name, groups, clients):
    from fedmtl.federated.scenario import count_clients

    cfg = _load(f"variants/{name}")
    assert [(g.dataset, g.single_task, g.replicas, g.local_epochs, g.tasks) for g in cfg.clients] == groups
    assert count_clients(cfg) == clients
    assert cfg.model.backbone == "swin_t" and cfg.rounds == 100 and type(cfg.algorithm).__name__ == "FedHCA2"
    first, *rest = (CONFIGS / "variants" / name).read_text().splitlines()
    assert first.startswith("# ") and "Table" in first
    assert f"--config variants/{name} --algorithm Local" in "\n".join(rest)  # its Local baseline


# --config NAME: a path first, else a bundled config (fedmtl.bundled).


def _print_config(capsys, *configs: str) -> str:
    from fedmtl.cli import main

    with pytest.raises(SystemExit) as done:
        main(["fit", *configs, "--print_config"])
    assert done.value.code == 0
    return capsys.readouterr().out


def _refused(capsys, argv: list[str]) -> str:
    from fedmtl.cli import main

    assert main(argv) != 0
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith("error: ") and not captured.out
    return line


def test_a_bundled_config_by_name_from_any_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no configs/ here
    out = _print_config(capsys, "--config", "scenario1.yaml")
    assert "run_dir: runs/scenario1" in out and "class_path: fedmtl.methods.FedHCA2" in out
    out = _print_config(capsys, "--config", "feddea/demo.yaml")  # a subfolder's
    assert "FedDEA" in out and "root: data/demo" in out  # relative paths stay relative to the cwd
    # a unique base name, and the --config=NAME form
    out = _print_config(capsys, "--config=scenario1.yaml", "--config", "fedprox.yaml")
    assert "class_path: fedmtl.methods.FedProx" in out and "run_dir: runs/scenario1" in out
    out = _print_config(capsys, "--config", "configs/scenario2.yaml")  # as the README writes it
    assert "run_dir: runs/scenario2" in out
    assert list(tmp_path.iterdir()) == []


def test_a_file_wins_over_the_bundled_config_of_that_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scenario1.yaml").write_text((CONFIGS / "scenario1.yaml").read_text() + "rounds: 7\n")
    assert "rounds: 7" in _print_config(capsys, "--config", "scenario1.yaml")


def test_an_ambiguous_base_name_lists_the_candidates(tmp_path, monkeypatch, capsys):
    from fedmtl import bundled

    tree = tmp_path / "bundled"
    for folder in ("a", "b"):
        (tree / folder).mkdir(parents=True)
        (tree / folder / "x.yaml").write_text("# x\nrounds: 2\n")
    monkeypatch.setattr(bundled, "root", lambda: tree)
    monkeypatch.chdir(tree)
    line = _refused(capsys, ["fit", "--config", "x.yaml"])
    assert "config x.yaml is ambiguous" in line and "a/x.yaml, b/x.yaml" in line
    assert "a/x.yaml" in _refused(capsys, ["configs", "show", "x.yaml"])
    assert bundled.find("a/x.yaml") == "a/x.yaml"


@pytest.mark.parametrize("form", [["--config", "nope.yaml"], ["--config=nope.yaml"]])
def test_an_unknown_config_name_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, form):
    monkeypatch.chdir(tmp_path)
    line = _refused(capsys, ["fit", "--config", "scenario1.yaml", *form, "--run_dir", "run"])
    assert "config file nope.yaml not found" in line and "fedmtl configs" in line
    assert list(tmp_path.iterdir()) == []


def test_fedmtl_configs_lists_every_bundled_config_with_its_description(capsys):
    from fedmtl.cli import main

    assert main(["configs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected = sorted(str(p.relative_to(CONFIGS).as_posix()) for p in CONFIGS.rglob("*.yaml"))
    assert sorted(line.split()[0] for line in lines) == expected
    first = (CONFIGS / "scenario1.yaml").read_text().splitlines()[0].lstrip("# ")
    assert any(line.startswith("scenario1.yaml ") and line.endswith(first) for line in lines)
    assert any(line.split()[0] == "methods/fedprox.yaml" and "FedProx" in line for line in lines)


def test_fedmtl_configs_show_prints_one(capsys):
    from fedmtl.cli import main

    assert main(["configs", "show", "demo.yaml"]) == 0
    assert capsys.readouterr().out == (CONFIGS / "demo.yaml").read_text()
    assert main(["configs", "show", "fedprox.yaml"]) == 0
    assert capsys.readouterr().out == (CONFIGS / "methods" / "fedprox.yaml").read_text()
    line = _refused(capsys, ["configs", "show", "nope.yaml"])
    assert "no bundled config named nope.yaml" in line


def test_the_wheel_holds_every_config_and_they_load_from_any_directory(tmp_path):
    """A wheel built from the repository installs configs/ as fedmtl/configs/; an editable
    install reads configs/ in place. Both through importlib.resources, from a directory without
    a configs/ folder."""
    import shutil
    import subprocess
    import sys
    import zipfile

    pytest.importorskip("setuptools")
    repo = CONFIGS.parent
    src = tmp_path / "src"  # a copy: the build writes build/ and *.egg-info beside pyproject.toml
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(repo / name, src / name)
    for name in ("fedmtl", "configs"):
        shutil.copytree(repo / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*pip, "-q", "-w", str(tmp_path / "dist")], cwd=src, check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("fedmtl-*.whl")
    held = set(zipfile.ZipFile(wheel).namelist())
    for file in [*repo.glob("configs/**/*.yaml"), *repo.glob("fedmtl/**/*.py")]:
        rel = file.relative_to(repo).as_posix()
        assert ("fedmtl/" + rel if rel.startswith("configs/") else rel) in held, rel

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "elsewhere"
    work.mkdir()
    script = (
        "import sys, fedmtl; from fedmtl.cli import main; "
        f"assert fedmtl.__file__.startswith({str(site)!r}), fedmtl.__file__; sys.exit(main())"
    )
    argv = ["fit", "--config", "scenario1.yaml", "--config", "methods/fedprox.yaml", "--print_config"]
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", script, *argv], cwd=work, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "class_path: fedmtl.methods.FedProx" in done.stdout and "run_dir: runs/scenario1" in done.stdout
    assert list(work.iterdir()) == []

    # The editable install: its import hook (a finder module) maps fedmtl.configs to configs/.
    build = "import sys; from setuptools import build_meta; build_meta.build_editable(sys.argv[1])"
    subprocess.run([sys.executable, "-c", build, "ed"], cwd=tmp_path / "src", check=True, capture_output=True)
    (editable,) = (src / "ed").glob("fedmtl-*.whl")
    (finder,) = [n for n in zipfile.ZipFile(editable).namelist() if n.endswith("_finder.py")]
    zipfile.ZipFile(editable).extract(finder, tmp_path / "ed")
    script = (
        "import importlib.resources, importlib.util, sys\n"
        "venv = [m for m in sys.modules if m.startswith('__editable___fedmtl')]  # the shared venv's hook\n"
        "sys.meta_path = [f for f in sys.meta_path if getattr(f, '__module__', None) not in venv]\n"
        "spec = importlib.util.spec_from_file_location('finder_under_test', sys.argv[1])\n"
        "hook = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(hook)\n"
        "hook.install()\n"
        "import fedmtl\n"
        "print(fedmtl.__file__)\n"
        "print(importlib.resources.files('fedmtl.configs').joinpath('methods', 'fedprox.yaml'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "ed" / finder)],
        cwd=work,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        str(src / "fedmtl" / "__init__.py"),
        str(src / "configs" / "methods" / "fedprox.yaml"),
    ]


def test_the_benchmark_splits_scenario_1_clients_only_in_local_epochs(monkeypatch, tmp_path):
    """benchmark/scenario1.yaml gives its PASCAL clients different local epochs by listing them
    in three groups: the clients, their images and their optimisers must be those of the same
    file with the five in one group, as scenario 1 has them; only the epochs differ."""
    import yaml

    from fedmtl.config import RunConfig
    from fedmtl.federated import scenario
    from fedmtl.federated.scenario import build_clients

    # The partition needs the training split sizes: those the configs generate, without the data.
    monkeypatch.setattr(scenario, "train_split_size", lambda cfg, dataset: cfg.data.synth[dataset].num_train)
    # and the images a client trains on (a human-parts client reads its labels): all of them here
    monkeypatch.setattr(
        scenario.TrainedImages, "__call__", lambda self, dataset, tasks, indices: list(indices)
    )
    raw = yaml.safe_load((CONFIGS / "benchmark" / "scenario1.yaml").read_text())
    pascal = [group for group in raw["clients"] if group["dataset"] == "pascal_context"]
    one_group = {**pascal[0], "tasks": [t for group in pascal for t in group["tasks"]], "local_epochs": 1}
    raw["clients"] = [one_group] + [group for group in raw["clients"] if group["dataset"] != "pascal_context"]
    (tmp_path / "merged.yaml").write_text(yaml.safe_dump(raw))
    parser = _run_parser()

    def clients(path):
        return build_clients(RunConfig.from_namespace(parser.instantiate(parser.parse_path(str(path)))))

    split, merged = clients(CONFIGS / "benchmark" / "scenario1.yaml"), clients(tmp_path / "merged.yaml")
    assert [(c.name, c.train_indices, c.optimizer) for c in split] == [
        (c.name, c.train_indices, c.optimizer) for c in merged
    ]
    assert {c.name: c.local_epochs for c in split} == {
        "pascal_context-semseg": 6,
        "pascal_context-human_parts": 12,
        "pascal_context-sal": 1,
        "pascal_context-normals": 1,
        "pascal_context-edge": 1,
        "nyud-semseg+normals+edge+depth": 12,
    }


def test_the_benchmark_scenarios_share_data_and_recipe_and_differ_in_shape_and_epochs():
    """benchmark/scenario2.yaml says it is scenario1.yaml's data and recipe but for the local
    epochs: the same data, model, rounds and evaluation, one optimiser for every client; the
    clients are scenario 2's, with the epochs its comments give."""
    one, two = _load("benchmark/scenario1.yaml"), _load("benchmark/scenario2.yaml")
    for section in ("data", "model", "evaluation"):
        assert getattr(two, section) == getattr(one, section), section
    assert (two.rounds, two.cpu_threads) == (one.rounds, one.cpu_threads)
    optimizers = [g.optimizer for cfg in (one, two) for g in cfg.clients]
    assert all(o == optimizers[0] for o in optimizers)
    assert [(g.dataset, g.single_task, g.local_epochs, len(g.tasks)) for g in two.clients] == [
        ("nyud", True, 16, 4),
        ("pascal_context", False, 3, 5),
    ]


def test_the_label_skew_benchmark_is_scenario1s_under_a_dirichlet_split():
    """benchmark/label_skew.yaml says it is the scenario-1 benchmark with the PASCAL-Context
    images split by a Dirichlet(0.1) over dominant classes: nothing else may differ."""
    from dataclasses import replace

    one, skew = _load("benchmark/scenario1.yaml"), _load("benchmark/label_skew.yaml")
    for section in ("clients", "model", "evaluation", "rounds", "cpu_threads", "seed"):
        assert getattr(skew, section) == getattr(one, section), section
    assert replace(skew.data, partition=one.data.partition) == one.data
    assert type(skew.data.partition).__name__ == "Dirichlet" and skew.data.partition.alpha == 0.1
    assert skew.run_dir == "runs/benchmark/label_skew"
