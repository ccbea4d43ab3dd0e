"""CAGrad as a server step (fedmtl/methods/cagrad.py): hand cases, FMTL-Bench's formula, the
decoder groups, client sampling, the option checks, and one shared set of end-to-end runs
(1 process, 2 processes, killed after round 1 and resumed, then ``fedmtl report``)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from fedmtl.aggregation import ClientInfo, FlatLayout, RoundInput, decoder_owners_of
from fedmtl.aggregation.functional import conflict_averse_update
from fedmtl.cli import main
from fedmtl.federated import checkpoint
from fedmtl.methods import CAGrad, create_method
from tests.helpers import (
    fit,
    fit_in_processes,
    fit_killed_in_round,
    fit_refused,
    read_results,
    run_states,
    tiny_config,
)

RESCALED = 1 / 1.16  # 1/(1 + c²) at c = 0.4


def _layout(numel: int) -> FlatLayout:
    return FlatLayout(names=("w",), shapes=((numel,),), dtypes=(torch.float32,), tensor_layers=("",))


def _round(prev, deltas, participants=None, round_: int = 1) -> RoundInput:
    """N single-task semseg clients whose encoders and (one each) semseg decoders both start at
    ``prev`` and move by ``deltas``: the encoder step and the decoders' same-task step see the
    same rows, so both must give the same result."""
    prev, deltas = torch.tensor(prev, dtype=torch.float64), torch.tensor(deltas, dtype=torch.float64)
    clients = [ClientInfo(f"c{i}", "pascal_context", ("semseg",), 10) for i in range(len(prev))]
    return RoundInput(
        round=round_,
        clients=clients,
        encoder_layout=_layout(prev.shape[1]),
        encoders_prev=prev,
        encoder_deltas=deltas,
        decoder_layout=_layout(prev.shape[1]),
        decoder_owners=decoder_owners_of(clients),
        decoders_prev=prev.clone(),
        decoder_deltas=deltas.clone(),
        participants=participants,
    )


def _check(prev, deltas, update, **options) -> None:
    """Every client gets its own prev + ``update``, encoders and decoders alike (the encoders to
    float32 rounding: the engine forms them from float32 rows)."""
    out = CAGrad(**options).aggregate(_round(prev, deltas))
    want = torch.tensor(prev, dtype=torch.float64) + torch.tensor(update, dtype=torch.float64)
    torch.testing.assert_close(out.encoders, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out.decoders, want, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------- hand cases

# Each case: deltas Δ_i, their mean ḡ, ‖ḡ‖² = mean(G), c' = 0.4‖ḡ‖; the simplex weights w*
# minimise F(w) = ⟨g_w, ḡ⟩ + c'‖g_w‖; U = (ḡ + c'/‖g_w*‖ · g_w*) / (1 + c²) = (…) / 1.16.
# The prevs differ per client: each adds the one U to its own prev.


def test_two_orthogonal_deltas():
    # Δ = (1, 0), (0, 1): ḡ = (½, ½), ‖ḡ‖ = 1/√2, c' = 0.4/√2. F(w) = ½ + c'·√(w₁² + w₂²) is
    # least at w* = (½, ½): g_w = ḡ, ‖g_w‖ = 1/√2, so U = ḡ + 0.4·ḡ = (0.7, 0.7) before the
    # rescaling and (0.7, 0.7)/1.16 = (0.603448…, 0.603448…) after it.
    prev, deltas = [[1.0, 2.0], [-3.0, 0.5]], [[1.0, 0.0], [0.0, 1.0]]
    _check(prev, deltas, [[0.7 * RESCALED] * 2] * 2)
    _check(prev, deltas, [[0.7, 0.7]] * 2, rescale=False)


def test_two_opposed_deltas():
    # Δ = (2, 0), (−1, 0): ḡ = (½, 0), ‖ḡ‖ = ½, c' = 0.2. With w = (w₁, 1 − w₁):
    # g_w = (3w₁ − 1, 0), ⟨g_w, ḡ⟩ = 1.5w₁ − 0.5, F = 1.5w₁ − 0.5 + 0.2|3w₁ − 1|, which rises
    # from w₁ = 0 (slope 1.5 − 0.6 > 0 below ⅓, 2.1 above): w* = (0, 1), g_w = Δ₂, ‖g_w‖ = 1.
    # U = (½, 0) + 0.2·(−1, 0) = (0.3, 0): the client that disagrees loses least
    # (⟨U, Δ₂⟩ = −0.3 against ⟨ḡ, Δ₂⟩ = −0.5); (0.3, 0)/1.16 rescaled.
    prev, deltas = [[0.0, 1.0], [5.0, -1.0]], [[2.0, 0.0], [-1.0, 0.0]]
    _check(prev, deltas, [[0.3 * RESCALED, 0.0]] * 2)
    _check(prev, deltas, [[0.3, 0.0]] * 2, rescale=False)


def test_two_exactly_opposed_deltas_cancel():
    # Δ = (1, 0), (−1, 0): ḡ = 0, so c' = 0 and U = ḡ = 0: every client keeps its prev.
    _check([[1.0, 2.0], [3.0, 4.0]], [[1.0, 0.0], [-1.0, 0.0]], [[0.0, 0.0]] * 2)


def test_three_mixed_deltas():
    # Δ = (2, 0), (0, 2), (−1, 0): Δ₃ opposes Δ₁. ḡ = (⅓, ⅔), ‖ḡ‖² = 5/9, c' = 0.4√5/3 =
    # 0.298142…; G𝟙/3 = (⅔, 4/3, −⅓). At the vertex w* = (0, 0, 1): g_w = Δ₃ = (−1, 0),
    # ‖g_w‖ = 1, and ∂F/∂w_i = (G𝟙/3)_i + c'⟨Δ_i, g_w⟩ = (⅔ − 2c', 4/3, −⅓ + c')
    # = (0.0704, 1.333, −0.0352): the vertex's own is the least, so it is the minimum.
    # U = ḡ + c'·(−1, 0) = ((1 − 0.4√5)/3, ⅔) = (0.035191…, 0.666…); /1.16 rescaled.
    prev, deltas = [[0.0, 0.0], [1.0, 1.0], [-2.0, 3.0]], [[2.0, 0.0], [0.0, 2.0], [-1.0, 0.0]]
    update = [(1 - 0.4 * math.sqrt(5)) / 3, 2 / 3]
    _check(prev, deltas, [[u * RESCALED for u in update]] * 3)
    _check(prev, deltas, [update] * 3, rescale=False)


def test_c_zero_adds_the_mean_delta_to_each_clients_own_prev():
    # c = 0: c' = 0, U = ḡ (1 + 0² = 1): FedAvg's update, added to each client's own prev.
    _check([[1.0, 0.0], [0.0, 1.0]], [[1.0, 3.0], [3.0, -1.0]], [[2.0, 1.0]] * 2, c=0.0)


# ---------------------------------------------------------------------------- FMTL-Bench's formula


def _fmtl_bench(deltas: np.ndarray, c: float = 0.4, rescale: int = 1) -> np.ndarray:
    """FMTL-Bench's ``get_cagrad_delta_all`` as its formula reads (aggregate_all.py): its 1e-8
    terms inside the square roots and added to c·‖ḡ‖ and ‖g_w‖, SLSQP from 𝟙/N at its default
    tolerance; rescale 0: none, 1: 1/(1 + c²), 2: 1/(1 + c)."""
    from scipy.optimize import minimize

    n = len(deltas)
    gram = deltas @ deltas.T
    c_prime = c * math.sqrt(gram.mean() + 1e-8) + 1e-8
    uniform = np.full(n, 1.0 / n)

    def objective(w: np.ndarray) -> float:
        return float(w @ gram @ uniform + c_prime * math.sqrt(w @ gram @ w + 1e-8))

    constraint = {"type": "eq", "fun": lambda w: 1 - w.sum()}
    w = minimize(objective, uniform, bounds=[(0, 1)] * n, constraints=constraint).x
    g_w = w @ deltas
    g = deltas.mean(axis=0) + c_prime / (np.linalg.norm(g_w) + 1e-8) * g_w
    return g / {0: 1.0, 1: 1 + c * c, 2: 1 + c}[rescale]


@pytest.mark.parametrize("rescale", [True, False])
def test_equals_fmtl_benchmarks_formula_on_random_deltas(rescale):
    """To the accuracy of FMTL-Bench's own solve: SLSQP stops on a change of F of 1e-6, which
    leaves w* off by up to about its square root (here U differs by at most 6e-5 of its norm);
    fedmtl's solve is polished to float64 rounding (tests/test_functional.py)."""
    generator = np.random.default_rng(0)
    for _ in range(5):
        deltas = generator.normal(size=(5, 40)) + generator.normal(size=40)  # a shared direction
        prev = generator.normal(size=(5, 40))
        out = CAGrad(rescale=rescale).aggregate(_round(prev.tolist(), deltas.tolist()))
        want = prev + _fmtl_bench(deltas, rescale=int(rescale))
        error = np.linalg.norm(out.encoders.numpy() - want) / np.linalg.norm(want - prev)
        assert error < 5e-4, error


def test_fmtl_benchmarks_rescale_two_is_a_constant_factor_of_the_unscaled_update():
    """FMTL-Bench's third option (rescale=2, 1/(1 + c)) is not offered: it is U·(1 + c²)/(1 + c),
    a factor a client's learning rate absorbs (docs/methods.md, CAGrad)."""
    deltas = np.array([[2.0, 0.0], [0.0, 2.0], [-1.0, 0.0]])
    unscaled = conflict_averse_update(torch.tensor(deltas), c=0.4, rescale=False).numpy()
    np.testing.assert_allclose(_fmtl_bench(deltas, rescale=2), unscaled / 1.4, rtol=1e-6)


# ---------------------------------------------------------------------------- decoders, sampling


def _kept(method: CAGrad, inputs: RoundInput) -> list[bool]:
    """The decoder rows the server step leaves as their clients hold them (``aggregate`` does
    not return them): the step as the engine runs it, on rows."""
    from tests.test_stream import _streamed

    return _streamed(method, inputs, inputs.encoders_prev + inputs.encoder_deltas)[1].decoders_kept.tolist()


def _mixed_round(participants=None) -> RoundInput:
    """Clients A: semseg, B: semseg+depth, C: sal; 1-d encoders and decoders. Decoder rows:
    A:semseg, B:semseg, B:depth, C:sal."""
    clients = [
        ClientInfo("A", "pascal_context", ("semseg",), 10),
        ClientInfo("B", "nyud", ("semseg", "depth"), 10),
        ClientInfo("C", "pascal_context", ("sal",), 10),
    ]
    owners = decoder_owners_of(clients)
    encoder_deltas = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    decoder_deltas = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [2.0, 0.0]], dtype=torch.float64)
    for i in set(range(3)) - set(participants or range(3)):  # sat out: a zero delta, as the engine gives
        encoder_deltas[i] = 0
        decoder_deltas[[k for k, (owner, _) in enumerate(owners) if owner == i]] = 0
    return RoundInput(
        round=1,
        clients=clients,
        encoder_layout=_layout(2),
        encoders_prev=torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]], dtype=torch.float64),
        encoder_deltas=encoder_deltas,
        decoder_layout=_layout(2),
        decoder_owners=owners,
        decoders_prev=torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [3.0, 0.0]], dtype=torch.float64),
        decoder_deltas=decoder_deltas,
        participants=participants,
    )


def test_decoders_of_one_task_get_their_own_step_and_a_lone_decoder_is_scaled():
    # semseg: A's (1, 0) and B's (0, 1) are the orthogonal case: U = (0.7, 0.7)/1.16 each.
    # depth and sal have one decoder each: w* = 1, g_w = Δ = ḡ, c' = 0.4‖Δ‖, so
    # U = Δ + 0.4Δ = 1.4Δ, /1.16: (1 + c)/(1 + c²) = 1.2069 × the client's own delta.
    inputs = _mixed_round()
    out = CAGrad().aggregate(inputs)
    semseg = torch.tensor([0.7, 0.7], dtype=torch.float64) * RESCALED
    want = torch.stack(
        [
            inputs.decoders_prev[0] + semseg,
            inputs.decoders_prev[1] + semseg,
            inputs.decoders_prev[2] + 1.4 * RESCALED * inputs.decoder_deltas[2],
            inputs.decoders_prev[3] + 1.4 * RESCALED * inputs.decoder_deltas[3],
        ]
    )
    torch.testing.assert_close(out.decoders, want, rtol=1e-6, atol=1e-6)
    assert _kept(CAGrad(), inputs) == [False] * 4
    # The encoders: one step over all three clients, whatever their tasks.
    update = conflict_averse_update(inputs.encoder_deltas)
    torch.testing.assert_close(out.encoders, inputs.encoders_prev + update, rtol=1e-6, atol=1e-6)


def test_decoder_scope_none_keeps_each_trained_decoder():
    inputs = _mixed_round()
    method = CAGrad(decoder_scope="none")
    out = method.aggregate(inputs)
    assert torch.equal(out.decoders, inputs.decoders_prev + inputs.decoder_deltas)
    assert _kept(method, inputs) == [True] * 4
    assert method.shared_parts == {"encoder"}
    assert CAGrad().shared_parts == {"encoder", "decoders"}


def test_a_client_that_did_not_train_receives_the_update_of_those_that_did():
    """B sits the round out: U is solved from A's and C's deltas only (B's zero delta would
    pull the mean towards 0), and B gets its own prev + U too. A's semseg decoder alone
    trained: the semseg group's U is 1.4/1.16 × A's delta, which B's semseg decoder receives;
    B's depth decoder, with nobody of its task training, is kept."""
    inputs = _mixed_round(participants=(0, 2))
    method = CAGrad(participation=0.5)
    assert method.reads_every_client and not method.needs_every_client
    out = method.aggregate(inputs)
    update = conflict_averse_update(inputs.encoder_deltas[[0, 2]])
    torch.testing.assert_close(out.encoders, inputs.encoders_prev + update, rtol=1e-6, atol=1e-6)
    semseg = 1.4 * RESCALED * inputs.decoder_deltas[0]
    sal = 1.4 * RESCALED * inputs.decoder_deltas[3]
    prev = inputs.decoders_prev
    want = torch.stack([prev[0] + semseg, prev[1] + semseg, prev[2], prev[3] + sal])
    torch.testing.assert_close(out.decoders, want, rtol=1e-6, atol=1e-6)
    assert _kept(method, inputs) == [False, False, True, False]


@pytest.mark.parametrize("options", [{}, {"participation": 0.5}, {"decoder_scope": "none", "rescale": False}])
def test_the_engines_row_by_row_step_equals_aggregate(options):
    """The streamed form (rows read 97 columns at a time, each client's encoder formed alone)
    against the stacked one, over rounds with sampling, on tests/test_stream.py's scenario."""
    from tests.test_stream import CLIENTS, _streamed
    from tests.test_stream import _round as stream_round

    method = create_method("CAGrad", **options)
    method.setup(3, CLIENTS, seed=0)
    streamed = copy.deepcopy(method)
    for round_ in range(1, 4):
        participants = tuple(method.participants(round_) or ()) or None
        inputs, trained = stream_round(round_, participants)
        expected = method.aggregate(inputs)
        expected.check_against(inputs)
        encoders, output = _streamed(streamed, inputs, trained)
        error = (encoders - expected.encoders).norm(dim=1) / expected.encoders.norm(dim=1)
        assert float(error.max()) <= 1e-6
        assert torch.equal(output.decoders, expected.decoders)


# ---------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"c": 1.0},
            "algorithm.c must be in [0, 1) (the conflict-averse radius), got 1.0; FMTL-Bench uses 0.4",
        ),
        (
            {"c": -0.1},
            "algorithm.c must be in [0, 1) (the conflict-averse radius), got -0.1; FMTL-Bench uses 0.4",
        ),
        ({"c": float("nan")}, "algorithm.c must be in [0, 1) (the conflict-averse radius), got nan"),
        ({"rescale": 2}, "algorithm.rescale must be true or false, got 2"),
        ({"decoder_scope": "all"}, "algorithm.decoder_scope must be one of ['same_task', 'none'], got 'all'"),
        (
            {"participation": 0.0},
            "algorithm.participation must be in (0, 1] (a fraction of the clients), got 0.0",
        ),
    ],
)
def test_each_bad_option_is_refused_naming_the_field_and_its_range(options, message):
    with pytest.raises(ValueError) as refused:
        CAGrad(**options)
    assert str(refused.value).startswith(message)


def test_a_bad_option_on_the_command_line_is_one_error_line_and_writes_nothing(tmp_path, data_root, capsys):
    run_dir = tmp_path / "run"
    lines = fit_refused(
        tiny_config(tmp_path, data_root), run_dir, capsys, "--algorithm", "CAGrad", "--algorithm.c", "1"
    )
    assert lines == [
        "error: algorithm.c must be in [0, 1) (the conflict-averse radius), got 1.0; FMTL-Bench uses 0.4"
    ]


def test_built_from_its_config_fragment_options():
    method = create_method("CAGrad", c=0.2, rescale=False, decoder_scope="none", participation=0.5)
    assert (method.c, method.rescale, method.decoder_scope, method.participation) == (0.2, False, "none", 0.5)
    assert method.state_dict() == {}


# ---------------------------------------------------------------------------- end to end


# Three clients sharing the normals task (PASCAL-Context's and NYUD-v2's decoders form one group)
# and scoring no semseg: a tiny run's mIoU is 0, which would leave the report's Δm undefined.
CLIENTS = [
    {"dataset": "pascal_context", "tasks": ["sal", "normals"], "single_task": True, "batch_size": 4},
    {"dataset": "nyud", "tasks": ["normals", "depth"], "local_epochs": 2, "batch_size": 4},
]


@pytest.fixture(scope="module")
def runs(module_dir, data_root):
    """A tiny scenario under CAGrad, 2 rounds: on 1 process, on 2 CPU processes, and killed as
    round 2 starts then resumed from round 1's checkpoint."""
    config = tiny_config(module_dir, data_root, algorithm={"class_path": "CAGrad"}, rounds=2, clients=CLIENTS)
    one = fit(config, module_dir / "one")
    two = fit_in_processes(config, module_dir / "two")
    with pytest.MonkeyPatch.context() as patch:
        fit_killed_in_round(config, module_dir / "resumed", patch, 2)
    after_kill = checkpoint.latest(module_dir / "resumed").name
    resumed = fit(config, module_dir / "resumed", "--resume", "true")
    return {"dir": module_dir, "one": one, "two": two, "resumed": resumed, "after_kill": after_kill}


def test_two_processes_and_a_resumed_run_give_the_results_of_one(runs):
    assert runs["one"]["algorithm"] == "CAGrad"
    assert runs["after_kill"] == "round_0001"
    assert runs["two"] == runs["one"]
    assert runs["resumed"] == runs["one"]


def test_every_client_adds_the_same_update_to_its_own_parameters(runs):
    """The clients start from one encoder and each adds the same U every round, so their
    encoders stay equal. Their normals decoders (PASCAL-Context's and NYUD-v2's) start apart and
    each adds the same U_normals, so they stay exactly as far apart as after round 1; heads local."""
    run = runs["dir"] / "one"
    first, last = (
        [s["model"] for s in run_states(run, folder)[:3]] for folder in checkpoint.round_folders(run)
    )
    sal, normals, mt = last
    for key in sal:
        if key.startswith("encoder.") and "running" not in key and "num_batches" not in key:
            torch.testing.assert_close(sal[key], mt[key], rtol=0, atol=1e-6)
            torch.testing.assert_close(sal[key], normals[key], rtol=0, atol=1e-6)
    key = "decoders.normals.fuse.weight"
    apart = normals[key] - mt[key]
    assert apart.abs().max() > 1e-3
    torch.testing.assert_close(apart, first[1][key] - first[2][key], rtol=0, atol=1e-6)
    assert not torch.equal(normals[key], first[1][key])  # and they did move
    head = "heads.normals.classifier.weight"
    assert not torch.equal(normals[head], mt[head])


def test_report_lists_a_cagrad_row(runs, capsys):
    capsys.readouterr()
    run = str(runs["dir"] / "one")
    assert main(["report", run, "--baseline", run]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| CAGrad")]
    assert len(rows) == 1
    assert read_results(runs["dir"] / "one")["evaluated"] == "post-aggregation"
