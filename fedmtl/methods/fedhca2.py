"""FedHCA²: Hyper Conflict-Averse encoders, Hyper Cross-Attention decoders, learned hyper weights."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch
from torch import Tensor

from fedmtl.aggregation.base import HOMOGENEOUS_RULES, RoundInput, RoundOutput
from fedmtl.aggregation.functional import (
    conflict_averse_coefficients,
    cross_attention_update_flat,
    mean_rows,
)
from fedmtl.aggregation.stream import EncoderMix, EncoderRows
from fedmtl.methods.base import Method, register_method
from fedmtl.methods.checks import non_negative, one_of, positive, refuse, within

# Why alpha_init and beta_init lie in [0, 1], for the error that refuses one outside.
_HYPER_INIT_RANGE = (
    ": the hyper weight is applied as clamp(w, 0, 1) and its gradient is passed only on [0, 1] "
    "(bounds included, as in the public code), so from outside it would never learn; the paper uses 0.1"
)
EncoderMode = Literal["none", "fedavg", "conflict_averse"]
DecoderMode = Literal["none", "cross_attention", "fedavg"]

#: The encoder rows each encoder mode reads (``Method.encoder_rows``).
_ENCODER_ROWS: dict[str, tuple[str, ...]] = {
    "none": (),
    "fedavg": ("trained",),
    "conflict_averse": ("delta",),
}

_STATE_KEYS = {
    "round",
    "encoder",
    "decoder",
    "clients",
    "decoder_owners",
    "decoder_layers",
    "alpha",
    "beta",
    "optimizer",
    "encoder_update",
    "decoder_update",
}


@register_method
class FedHCA2(Method):
    """FedHCA² (Lu et al., "FedHCA²: Towards Hetero-Client Federated Multi-Task Learning",
    CVPR 2024, Sec. 3.3-3.5 and suppl. Alg. 1-2); docs/methods.md, FedHCA2.

    Round r receives θ^(r-1) and Δ^(r) of N client encoders and K decoders and returns
    personalised θ^(r). Heads stay local (they are not in the round's input).

    Encoders (``encoder``):

    - ``"conflict_averse"`` (Hyper Conflict-Averse aggregation, Eq. 6-9): one update Ũ is
      solved from the N raw encoder deltas (:func:`~fedmtl.aggregation.functional.conflict_averse_update`
      with ``c`` and ``rescale``), and client i gets θ_i^(r-1) + Δ̃_i + clamp(α_i, 0, 1)·Ũ,
      where Δ̃_i is the mean delta of client i's homogeneous group (a client alone in its
      group keeps its own delta), as the public code does. ``homogeneous_groups`` says who
      is in a group (:func:`~fedmtl.aggregation.base.homogeneous_groups`): ``"same_tasks"``
      (default) any clients with the same dataset and task set; ``"adjacent"`` the public
      code's rule, runs of consecutive clients with the same dataset and the same ordered task
      list. The two agree on every scenario a fedmtl config builds (a group's replicas are
      consecutive, their tasks in one order), the paper's among them.
    - ``"fedavg"``: every encoder becomes the mean of the N trained encoders θ_i^(r-1) + Δ_i.
    - ``"none"``: every client keeps its trained encoder θ_i^(r-1) + Δ_i.

    Decoders (``decoder``):

    - ``"cross_attention"`` (Hyper Cross-Attention aggregation, Eq. 12-13): for every
      decoder parameter tensor (weight and bias apart), A = softmax(V Vᵀ/sqrt(d)) V over the
      K decoders' raw deltas V [K, d]; decoder k gets θ_k^(r-1) + Δ_k + clamp(β_{k,l}, 0, 1)·A_k,
      l the layer (module) owning the tensor (``decoder_layout.layers``; six for the FCN
      decoder). Decoders use their own raw delta Δ_k, not a homogeneous-group mean:
      the paper names group means for encoders only, and the public code's
      ``HyperCrossAttention`` adds each decoder's own delta.
    - ``"fedavg"``: every decoder, whatever its task, becomes the mean of the K trained decoders.
    - ``"none"``: every decoder keeps its trained parameters.

    ``encoder="fedavg", decoder="fedavg"`` is FedAvg and ``"none", "none"`` is Local; mixed
    settings are the paper's ablations (Table 3: "+Enc", "+Dec").

    Hyper aggregation weights (Sec. 3.5): α [N] (with ``"conflict_averse"``) and β [K, L]
    (with ``"cross_attention"``) start at ``alpha_init`` / ``beta_init``, are created at the
    first round from its sizes, and are applied clamped to [0, 1]. At the start of round
    r+1's aggregation, once the new deltas exist (so first in round 2), one step of
    ``torch.optim.SGD(lr=hyper_lr, momentum=hyper_momentum, weight_decay=hyper_weight_decay)``
    takes the gradients (Eq. 16-17, as the public code's autograd through clamp gives them)

        ∂α_i     = −⟨Ũ^(r), Δ_i^(r+1)⟩ · 1[0 ≤ α_i ≤ 1]
        ∂β_{k,l} = −Σ_{tensors t of layer l} ⟨A_{k,t}^(r), Δ_{k,t}^(r+1)⟩ · 1[0 ≤ β_{k,l} ≤ 1]

    with Δ^(r+1) each client's / decoder's raw new delta (the public code backpropagates
    ``last − current`` parameters of the client). A weight grows when the next local update
    agrees with the aggregated update it scaled. The gradient passes on the closed interval
    [0, 1], bounds included, as torch.clamp's backward did under the public code's PyTorch
    2.1.2 (PyTorch 2.14 made it the open interval, so the mask is computed here, not taken
    from the installed clamp): a weight initialised at 0 or 1 learns from round 2. Outside
    [0, 1] the gradient is zero but momentum and weight decay still act: one pushed above 1
    is applied as 1 until weight decay (or momentum) brings it back, one pushed below 0 is
    applied as 0. The server keeps Ũ^(r) [P] and A^(r) [K, Q] between rounds for this.

    α and β (and their momentum) are float64 on the CPU, so they are identical on every rank
    and device; Ũ and A stay in the inputs' dtype and device. Rounds must be consecutive
    and keep the same clients, decoders and decoder layers.

    Args:
        c: conflict-averse radius, c ∈ [0, 1) (paper: 0.4 best of 0.2-0.8).
        rescale: divide Ũ by (1 + c²) (CAGrad's and the public code's default).
        alpha_init: initial α: 0.1, as suppl. Tab. 4 and the public code's ``--enc_alpha_init``
            default, and the value of the reported FedHCA² rows. The supplement's text says
            0.01 (Tab. 4's 0.01 row gives Δm 1.67 instead of 2.18); 0.1 is kept.
        beta_init: initial β: 0.1 (``--dec_beta_init``; the same discrepancy as ``alpha_init``).
        hyper_lr: SGD learning rate of α and β (suppl. C: 0.01).
        hyper_momentum: SGD momentum (suppl. C: 0.9).
        hyper_weight_decay: SGD weight decay (suppl. C: 1e-4).
        encoder: encoder aggregation, see above.
        decoder: decoder aggregation, see above.
        homogeneous_groups: who shares a group-mean delta, ``"same_tasks"`` or
            ``"adjacent"`` (the public code's rule), see above.
        participation: must be 1: the conflict-averse solve and the cross-attention need
            every client's update in every round, and the hyper weights learn from them.
    """

    def __init__(
        self,
        c: float = 0.4,
        rescale: bool = True,
        alpha_init: float = 0.1,
        beta_init: float = 0.1,
        hyper_lr: float = 0.01,
        hyper_momentum: float = 0.9,
        hyper_weight_decay: float = 1e-4,
        encoder: EncoderMode = "conflict_averse",
        decoder: DecoderMode = "cross_attention",
        participation: float = 1.0,
        homogeneous_groups: str = "same_tasks",  # str, not a Literal: the refusal below says more
    ) -> None:
        if participation != 1:
            raise ValueError(
                f"algorithm.participation is {participation!r}, but FedHCA2 needs every client in every "
                "round (its conflict-averse and cross-attention steps mix all updates): use 1, or another method"
            )
        super().__init__(participation=1.0)
        decoders: dict[str, Callable[[RoundInput], Tensor]] = {
            "none": self._decoders_local,
            "fedavg": self._decoders_fedavg,
            "cross_attention": self._decoders_cross_attention,
        }
        one_of("encoder", encoder, sorted(_ENCODER_ROWS))
        one_of("decoder", decoder, sorted(decoders))
        if homogeneous_groups not in HOMOGENEOUS_RULES:
            refuse(
                "homogeneous_groups",
                f"one of {list(HOMOGENEOUS_RULES)}",
                homogeneous_groups,
                " (who shares a group-mean encoder delta): same_tasks groups any clients with the same "
                "dataset and task set, adjacent only consecutive ones with the same ordered task list, "
                "as the public code",
            )
        within("c", c, "[0, 1)", " (the conflict-averse radius)", "; the paper uses 0.4")
        for name, value in [("alpha_init", alpha_init), ("beta_init", beta_init)]:
            within(name, value, "[0, 1]", after=_HYPER_INIT_RANGE)
        hyper_lr_what = "hyper_lr (the SGD learning rate of the hyper weights)"  # named with what it is
        positive(hyper_lr_what, hyper_lr, after="; the paper uses 0.01", finite=True)
        within("hyper_momentum", hyper_momentum, "[0, 1)", after="; the paper uses 0.9")
        non_negative("hyper_weight_decay", hyper_weight_decay, after="; the paper uses 1e-4", finite=True)
        self.c = float(c)
        self.rescale = bool(rescale)
        self.alpha_init = float(alpha_init)
        self.beta_init = float(beta_init)
        self.hyper_lr = float(hyper_lr)
        self.hyper_momentum = float(hyper_momentum)
        self.hyper_weight_decay = float(hyper_weight_decay)
        self.encoder = encoder
        self.decoder = decoder
        self.homogeneous_groups = homogeneous_groups
        self._aggregate_decoders = decoders[decoder]
        self._reset()

    @property
    def shared_parts(self) -> frozenset[str]:
        """Encoders and decoders (each client's update up, its personalised parameters down), a
        part aggregated as ``none`` not at all; α, β, Ũ and A never leave the server."""
        modes = {"encoder": self.encoder, "decoders": self.decoder}
        return frozenset(part for part, mode in modes.items() if mode != "none")

    def _reset(self) -> None:
        self._round = 0  # the last round aggregated or skipped (skip_round); 0 before the first
        self._clients: list[str] = []  # names, for log_values and the consistency check
        self._owners: list[tuple[int, str]] = []
        self._layers: list[str] = []
        self._alpha: Tensor | None = None  # [N] float64 CPU leaf, applied as clamp(α, 0, 1)
        self._beta: Tensor | None = None  # [K, L]
        self._optimizer: torch.optim.SGD | None = None
        self._encoder_update: Tensor | None = None  # Ũ^(r) [P], as applied in the last round
        self._decoder_update: Tensor | None = None  # A^(r) [K, Q]

    # ------------------------------------------------------------------ the server step

    #: The conflict-averse solve and the cross-attention mix every client's update each round.
    needs_every_client = True

    def skip_round(self, round_: int) -> None:
        """No client trained: α, β, Ũ and A wait for the next round that has updates, which
        then follows this one."""
        self._round = round_

    individual_updates = (
        "weighs each decoder by cross-attention over the individual decoder updates, and (encoder: "
        "conflict_averse) solves a conflict-averse step on the Gram matrix of the individual encoder updates"
    )

    @property
    def reads_every_client(self) -> bool:  # type: ignore[override]
        """With ``encoder="fedavg"``, a client that did not train enters the mean with its
        round-start encoder, so its ``"trained"`` row is read (the conflict-averse step reads
        deltas, which are zero for such a client whether read or not)."""
        return self.encoder == "fedavg"

    def encoder_rows(self, round_: int) -> tuple[str, ...]:
        return _ENCODER_ROWS[self.encoder]

    @torch.no_grad()
    def server_step(self, inputs: RoundInput, encoders: Mapping[str, EncoderRows]) -> RoundOutput:
        # Each part first steps its hyper weights with this round's deltas and last round's
        # Ũ or A (from round 2 on), then applies them.
        self._check_round(inputs)
        if not self._clients:
            self._start(inputs)
        n, numel = inputs.num_clients, inputs.encoder_layout.numel
        if self.encoder == "none":
            mix = EncoderMix.kept(n, numel)
        elif self.encoder == "fedavg":
            mean = encoders["trained"].weighted_sums(torch.full((1, n), 1.0 / n, dtype=torch.float64))
            mix = EncoderMix(mean, mixing=torch.ones(n, 1, dtype=torch.float64), own={})
        else:
            mix = self._encoders_conflict_averse(inputs, encoders["delta"])
        decoders = self._aggregate_decoders(inputs)
        self._round = inputs.round
        return RoundOutput(encoders=mix, decoders=decoders)

    def _encoders_conflict_averse(self, inputs: RoundInput, deltas: EncoderRows) -> EncoderMix:
        """Hyper Conflict-Averse encoders in two passes over the deltas: G (with ⟨Δ_i, Ũ^(r-1)⟩),
        which steps α and gives Ũ's coefficients, then the homogeneous groups' mean deltas and
        Ũ; client i gets (θ_i^(r-1) + Δ_i) − Δ_i + Δ̄_g(i) + clamp(α_i)·Ũ."""
        n = inputs.num_clients
        previous = self._encoder_update
        gram = deltas.gram([] if previous is None else [previous])
        if previous is not None:
            self._step(self._alpha, -gram[:n, n])
        coefficients = conflict_averse_coefficients(gram[:n, :n], self.c, self.rescale)
        alpha = self._alpha.detach().clamp(0, 1)
        groups = inputs.homogeneous_groups(self.homogeneous_groups)
        weights = torch.zeros(len(groups) + 1, n, dtype=torch.float64)
        mixing = torch.zeros(n, len(groups) + 1, dtype=torch.float64)
        for g, group in enumerate(groups):
            weights[g, group] = 1.0 / len(group)
            mixing[group, g] = 1.0
        weights[-1] = coefficients
        mixing[:, -1] = alpha
        vectors = deltas.weighted_sums(weights)
        self._encoder_update = vectors[-1].clone()  # Ũ [P], kept for the next round
        own = {
            "trained": torch.ones(n, dtype=torch.float64),
            "delta": torch.full((n,), -1.0, dtype=torch.float64),
        }
        return EncoderMix(vectors, mixing, own)

    # ------------------------------------------------------------------ decoders (stacked)

    def _decoders_local(self, inputs: RoundInput) -> Tensor:
        return inputs.decoders_prev + inputs.decoder_deltas

    def _decoders_fedavg(self, inputs: RoundInput) -> Tensor:
        mean = mean_rows(inputs.decoders_prev) + mean_rows(inputs.decoder_deltas)
        return mean.repeat(inputs.num_decoders, 1)

    def _decoders_cross_attention(self, inputs: RoundInput) -> Tensor:
        deltas, layout = inputs.decoder_deltas, inputs.decoder_layout
        previous = self._decoder_update
        if previous is not None:
            agreement = previous.to(deltas.device, torch.float64) * deltas.to(torch.float64)
            self._step(self._beta, -layout.layer_sum(agreement).cpu())
        attention = cross_attention_update_flat(deltas, layout)  # A [K, Q]
        beta = self._beta.clamp(0, 1).to(device=deltas.device, dtype=deltas.dtype)
        out = inputs.decoders_prev + deltas
        out.addcmul_(beta[:, layout.layer_index(deltas.device)], attention)
        self._decoder_update = attention
        return out

    def _step(self, weight: Tensor, gradient: Tensor) -> None:
        """One SGD step of α or β, with the gradient passed on the closed interval [0, 1]."""
        # Bounds included: the public code's autograd through clamp under PyTorch 2.1.2.
        inside = (weight >= 0) & (weight <= 1)
        weight.grad = torch.where(inside, gradient.to(torch.float64), 0.0)
        # One optimiser holds α and β: a step moves only those with a gradient set.
        self._optimizer.step()
        weight.grad = None

    # ------------------------------------------------------------------ state

    def _check_round(self, inputs: RoundInput) -> None:
        if not self._clients:  # no aggregation yet (rounds before may have been skipped)
            if inputs.round != self._round + 1:
                raise ValueError(
                    f"FedHCA2 has no server state but got round {inputs.round}: start at round "
                    f"{self._round + 1}, "
                    "or load_state_dict the checkpoint of round "
                    f"{inputs.round - 1} first"
                )
            return
        if inputs.round != self._round + 1:
            raise ValueError(
                f"FedHCA2 aggregated round {self._round} last; got round {inputs.round}. Rounds must be "
                "consecutive (the hyper weights learn from the next round's deltas)"
            )
        now = (
            [c.name for c in inputs.clients],
            list(inputs.decoder_owners),
            list(inputs.decoder_layout.layers),
        )
        before = (self._clients, self._owners, self._layers)
        for what, a, b in zip(["clients", "decoders (owner, task)", "decoder layers"], before, now):
            if a != b:
                raise ValueError(
                    f"FedHCA2's hyper weights belong to the {what} {a}; this round has {b}. The clients, "
                    "their decoders and the decoder layers must stay the same across rounds"
                )
        for what, stored, shape in [
            ("encoder update Ũ", self._encoder_update, (inputs.encoder_layout.numel,)),
            ("decoder updates A", self._decoder_update, tuple(inputs.decoder_deltas.shape)),
        ]:
            if stored is not None and tuple(stored.shape) != shape:
                raise ValueError(
                    f"FedHCA2's stored {what} has shape {tuple(stored.shape)}; this round needs {shape}: "
                    "the encoder and decoder layouts must stay the same across rounds"
                )

    def _start(self, inputs: RoundInput) -> None:
        """Remember who the clients are and create α [N] and β [K, L] at their initial values."""
        self._clients = [c.name for c in inputs.clients]
        self._owners = list(inputs.decoder_owners)
        self._layers = list(inputs.decoder_layout.layers)
        alpha = beta = None
        if self.encoder == "conflict_averse":
            alpha = torch.full((inputs.num_clients,), self.alpha_init, dtype=torch.float64)
        if self.decoder == "cross_attention":
            shape = (inputs.num_decoders, len(self._layers))
            beta = torch.full(shape, self.beta_init, dtype=torch.float64)
        self._set_weights(alpha, beta)

    def _set_weights(self, alpha: Tensor | None, beta: Tensor | None) -> None:
        self._alpha = None if alpha is None else alpha.detach().clone().requires_grad_(True)
        self._beta = None if beta is None else beta.detach().clone().requires_grad_(True)
        params = [p for p in (self._alpha, self._beta) if p is not None]
        self._optimizer = (
            torch.optim.SGD(
                params,
                lr=self.hyper_lr,
                momentum=self.hyper_momentum,
                weight_decay=self.hyper_weight_decay,
            )
            if params
            else None
        )

    def state_dict(self) -> dict[str, Any]:
        """α, β, their SGD state, the last Ũ and A, the round, and whom the weights belong to.

        Tensors and plain values only (``torch.load(weights_only=True)`` reads it back). α, β
        and the optimiser state are copies; Ũ and A are returned as they are (the aggregator
        replaces them each round, never modifies them in place).
        """
        return {
            "round": self._round,
            "encoder": self.encoder,
            "decoder": self.decoder,
            "clients": list(self._clients),
            "decoder_owners": [[i, task] for i, task in self._owners],
            "decoder_layers": list(self._layers),
            "alpha": None if self._alpha is None else self._alpha.detach().clone(),
            "beta": None if self._beta is None else self._beta.detach().clone(),
            "optimizer": None if self._optimizer is None else copy.deepcopy(self._optimizer.state_dict()),
            "encoder_update": self._encoder_update,
            "decoder_update": self._decoder_update,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if set(state) != _STATE_KEYS:
            raise ValueError(f"not a FedHCA2 state: keys {sorted(state)}; expected {sorted(_STATE_KEYS)}")
        if (state["encoder"], state["decoder"]) != (self.encoder, self.decoder):
            raise ValueError(
                f"the state is from FedHCA2(encoder={state['encoder']!r}, decoder={state['decoder']!r}); "
                f"this one has encoder={self.encoder!r}, decoder={self.decoder!r}"
            )
        self._reset()
        self._round = int(state["round"])
        if not state["clients"]:  # no aggregation yet (round 0, or only skipped rounds)
            return
        for key, used in [
            ("alpha", self.encoder == "conflict_averse"),
            ("beta", self.decoder == "cross_attention"),
        ]:
            if (state[key] is not None) != used:
                raise ValueError(
                    f"FedHCA2 state of round {self._round}: {key} is {'missing' if used else 'unexpected'}"
                )
        self._clients = [str(name) for name in state["clients"]]
        self._owners = [(int(i), str(task)) for i, task in state["decoder_owners"]]
        self._layers = [str(layer) for layer in state["decoder_layers"]]
        self._set_weights(state["alpha"], state["beta"])
        if self._optimizer is not None:
            self._optimizer.load_state_dict(state["optimizer"])
        self._encoder_update = state["encoder_update"]
        self._decoder_update = state["decoder_update"]

    def log_values(self) -> dict[str, float]:
        """``alpha/<client>`` and ``beta/<client>/<task>/<layer>``: the clamped weights as applied."""
        values: dict[str, float] = {}
        if self._alpha is not None:
            for name, a in zip(self._clients, self._alpha.detach().clamp(0, 1).tolist()):
                values[f"alpha/{name}"] = a
        if self._beta is not None:
            for (i, task), row in zip(self._owners, self._beta.detach().clamp(0, 1).tolist()):
                for layer, b in zip(self._layers, row):
                    values[f"beta/{self._clients[i]}/{task}/{layer}"] = b
        return values

    def log_matrices(self) -> dict[str, tuple[list[str], list[str], Tensor]]:
        """``beta``: the clamped β as applied, one row per decoder (``client / task``), one
        column per decoder layer (the paper's Fig. 7)."""
        if self._beta is None:
            return {}
        rows = [f"{self._clients[i]} / {task}" for i, task in self._owners]
        return {"beta": (rows, list(self._layers), self._beta.detach().clamp(0, 1).float())}

    def __repr__(self) -> str:
        return (
            f"FedHCA2(c={self.c}, rescale={self.rescale}, alpha_init={self.alpha_init}, "
            f"beta_init={self.beta_init}, hyper_lr={self.hyper_lr}, hyper_momentum={self.hyper_momentum}, "
            f"hyper_weight_decay={self.hyper_weight_decay}, encoder={self.encoder!r}, decoder={self.decoder!r}, "
            f"homogeneous_groups={self.homogeneous_groups!r})"
        )
