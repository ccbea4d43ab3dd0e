"""configs/synthetic.yaml: a paper scenario's exact model and input sizes on generated data.

Nothing is generated or trained here (Swin-T at 512x512 is far too slow for a test): the
client partitions come from the real partition logic with the generated split sizes, and the
images of the human_parts client (which keeps only images with a person) are counted from
the generator's scenes, which are drawn without rendering.
"""

from dataclasses import replace
from pathlib import Path

import pytest

from fedmtl.cli import _run_parser
from fedmtl.config import DataConfig, RunConfig, render_size
from fedmtl.data.datasets import DATASETS
from fedmtl.federated import scenario
from fedmtl.federated.scenario import build_clients, count_clients
from fedmtl.synth import sample_rng
from fedmtl.synth.scenes import pascal_scene

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
SCENARIOS = ["scenario1.yaml", "scenario2.yaml"]
# The extra images configs/synthetic.yaml's comments ask for with the 2C / 4C replicas.
REPLICA_COUNTS = {2: {"pascal_context": 192, "nyud": 64}, 4: {"pascal_context": 352, "nyud": 128}}


def _config(*names: str, args: tuple[str, ...] = ()) -> RunConfig:
    parser = _run_parser()
    argv = [a for name in names for a in ("--config", str(CONFIGS / name))] + list(args)
    return RunConfig.from_namespace(parser.instantiate(parser.parse_args(argv)))


def _has_person(cfg: RunConfig, index: int) -> bool:
    """Whether generated PASCAL-Context training image ``index`` has a person in its scene."""
    synth = cfg.data.synth["pascal_context"]
    rng = sample_rng("pascal_context", synth.seed, "train", index)
    scene = pascal_scene(rng, render_size(tuple(synth.size), synth.render_scale))  # as the generator draws it
    return any(o.name == "person" for o in scene.objects)


def _training_images(cfg: RunConfig, monkeypatch) -> dict[str, int]:
    """Every client's training images: its partition of the generated training split, less
    the images a human_parts-only client drops (those without a person)."""
    monkeypatch.setattr(scenario, "train_split_size", lambda c, dataset: c.data.synth[dataset].num_train)

    def trained(self, dataset: str, tasks: tuple[str, ...], indices) -> list[int]:  # the data is not written
        parts_only = dataset == "pascal_context" and tasks == ("human_parts",)
        return [i for i in indices if _has_person(cfg, i)] if parts_only else list(indices)

    monkeypatch.setattr(scenario.TrainedImages, "__call__", trained)
    specs = build_clients(cfg)
    assert len(specs) == count_clients(cfg)
    return {
        s.name: sum(map(lambda i: _has_person(cfg, i), s.train_indices))
        if s.dataset == "pascal_context" and s.tasks == ("human_parts",)
        else len(s.train_indices)
        for s in specs
    }


@pytest.mark.parametrize("name", SCENARIOS)
def test_synthetic_keeps_the_scenario_model_clients_and_paper_sizes(name):
    paper, cfg = _config(name), _config(name, "synthetic.yaml")
    assert cfg.model == paper.model and cfg.model.backbone == "swin_t"
    assert cfg.clients == paper.clients and type(cfg.algorithm) is type(paper.algorithm)
    assert cfg.data.train_size is None  # each dataset's paper size
    assert cfg.data.root is not None and Path(cfg.data.root) != Path(DataConfig().resolved_root())
    assert Path(cfg.data.root) != Path("data")  # never the default (real) data root
    assert cfg.rounds == 1 and cfg.evaluation.every == 0 and not cfg.logger.wandb
    assert Path(cfg.run_dir).parts[0] == "runs"
    for dataset in {g.dataset for g in cfg.clients}:
        # At least the paper size (the random crops are the paper's) and at most it (evaluation
        # pads to it but refuses a larger image): exactly the paper size.
        synth, paper_size = cfg.data.synth[dataset], DATASETS.get(dataset).train_size
        assert all(s >= p for s, p in zip(synth.size, paper_size, strict=True)), (dataset, synth.size)
        assert tuple(synth.size) == tuple(paper_size), (dataset, synth.size)


@pytest.mark.parametrize("name", SCENARIOS)
def test_synthetic_gives_every_client_a_batch(name, monkeypatch):
    cfg = _config(name, "synthetic.yaml")
    batch = {g.dataset: g.batch_size for g in cfg.clients}
    images = _training_images(cfg, monkeypatch)
    assert len(images) == {"scenario1.yaml": 6, "scenario2.yaml": 5}[name]
    short = {client: n for client, n in images.items() if n < batch[client.split("-")[0]]}
    assert not short, f"clients with fewer training images than their batch size: {short}"


@pytest.mark.parametrize("replicas", sorted(REPLICA_COUNTS))
@pytest.mark.parametrize("name", SCENARIOS)
def test_synthetic_with_replicas_and_the_counts_its_comments_give(name, replicas, monkeypatch):
    counts = REPLICA_COUNTS[replicas]
    args = tuple(a for d, n in counts.items() for a in (f"--data.synth.{d}.num_train", str(n)))
    cfg = _config(name, "synthetic.yaml", args=args)
    cfg = replace(cfg, clients=[replace(g, replicas=replicas) for g in cfg.clients])
    images = _training_images(cfg, monkeypatch)
    assert len(images) == replicas * {"scenario1.yaml": 6, "scenario2.yaml": 5}[name]
    assert min(images.values()) >= 8, images
    text = (CONFIGS / "synthetic.yaml").read_text()
    assert all(f"num_train {n}" in text for n in counts.values())
