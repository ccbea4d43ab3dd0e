"""FedDEA (arXiv 2505.24185) as a plug-in: mask and rescale each update, then the host aggregates."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, Literal

from jsonargparse import lazy_instance
from torch import Tensor

from fedmtl.aggregation.base import Aggregator, RoundInput, RoundOutput
from fedmtl.aggregation.communication import Exchange
from fedmtl.aggregation.feddea import check_rho, feddea_mask
from fedmtl.aggregation.flat import FlatLayout
from fedmtl.aggregation.stream import EncoderRows
from fedmtl.methods.base import Method, register_method
from fedmtl.methods.checks import boolean, either
from fedmtl.methods.fedavg import FedAvg
from fedmtl.privacy.server import ServerPrivacy

HOSTS = ("FedAvg", "FedProx", "FedOpt")
# Methods whose server step is not an average of updates: FedDEA is not defined over them.
_NOT_AVERAGING = {
    "FedHCA2": "aggregates by conflict-averse and cross-attention weights, not by an average of updates",
    "FedAMP": "gives each client its own attention-weighted model, not an average of updates",
}


# jsonargparse's description of the default host, FedAvg() (it prints it in --help and
# --print_config, and takes --algorithm.host.OPTION against it); one object for every FedDEA, so
# each FedDEA built from it gets a FedAvg of its own.
_DEFAULT_HOST = lazy_instance(FedAvg)


@register_method
class FedDEA(Method):
    """FedDEA's update decoupling (docs/methods.md, FedDEA) in front of a host.

    Every slot's update (a client's encoder, each decoder, and each head when heads are
    shared) keeps its k = ⌈ρ·d⌉ entries of largest |Δ| and is multiplied by 1/ρ; the rest
    becomes 0 (:func:`fedmtl.aggregation.feddea_mask`: exactly k entries, ties to the lowest
    index). The host then aggregates the transformed updates as its own: FedAvg's mean,
    FedProx's (whose clients also train with the proximal term), or FedOpt's server
    optimiser. The transform belongs to the client; the simulation applies it in the server
    step (to each encoder row as it is made, to the stacked decoder and head deltas), which
    gives the same numbers. ρ = 1 is the host, bit for bit.

    What the paper leaves open and what is chosen here (docs/methods.md, FedDEA): the mask is taken
    per aggregation unit (``scope: unit``, the whole flattened encoder or decoder, as the
    paper's "flattened update vector"; ``scope: tensor`` masks each parameter tensor on its
    own); k rounds up; the mean is uniform over the slots of a group, zeros included; heads
    and BatchNorm statistics stay local in HC-FMTL; in the unified-model setting (the host's
    ``decoder_scope: same_task``, ``head_scope: same_task``) heads are averaged among the
    clients of their task, BatchNorm statistics still stay local; ρ is fixed.

    Everything but the server step's input is the host's: the clients' behaviour (FedProx's
    proximal term), the participation, the server state in checkpoints, the logged values.

    Args:
        rho: the fraction of each update kept, in (0, 1]; the paper's best range is 0.2–0.3.
        scope: ``unit`` (one mask per aggregation unit) or ``tensor`` (one per parameter tensor).
        rescale: multiply what is kept by 1/ρ (False: the paper's ablation, masking only).
        host: the method that aggregates the masked updates, with its own options: FedAvg (the
            default), FedProx or FedOpt (``--algorithm.host FedProx --algorithm.host.mu 0.01``).
    """

    def __init__(
        self,
        rho: float = 0.25,
        scope: Literal["unit", "tensor"] = "unit",
        rescale: bool = True,
        host: Method = _DEFAULT_HOST,
    ) -> None:
        check_rho(rho)
        either("scope", scope, "unit", "tensor", " (where FedDEA masks)")
        boolean("rescale", rescale)
        host = FedAvg() if host is _DEFAULT_HOST else host
        check_host(host)
        self.rho = float(rho)
        self.scope = scope
        self.rescale = rescale
        self.host = host

    def __getattr__(self, name: str) -> Any:
        """What FedDEA does not define is the host's (its options, ``also_evaluated``, ...)."""
        if name == "host" or name.startswith("__"):  # `host` unset: a half-built copy
            raise AttributeError(name)
        return getattr(self.host, name)

    # ------------------------------------------------------------------ the server step

    def server_step(self, inputs: RoundInput, encoders: Mapping[str, EncoderRows]) -> RoundOutput:
        """The host's step on the masked updates: the encoder rows are masked as they are made
        (:meth:`encoder_row`), the decoders and heads here."""
        return self.host.server_step(self._masked(inputs), encoders)

    def _masked(self, inputs: RoundInput) -> RoundInput:
        """``inputs`` with every stacked update masked: the decoders' and the heads'."""
        return dataclasses.replace(
            inputs,
            decoder_deltas=self.transform(inputs.decoder_deltas, inputs.decoder_layout),
            heads=[dataclasses.replace(g, deltas=self.transform(g.deltas, g.layout)) for g in inputs.heads],
        )

    def set_server_privacy(self, privacy: ServerPrivacy | None) -> None:
        """The host's noise, scaled to the masked update's sensitivity: a clipped update of norm
        at most C keeps at most that norm under the mask, and 1/ρ times it rescaled."""
        if privacy is not None and self.rescale:
            privacy = dataclasses.replace(privacy, sum_stddev=privacy.sum_stddev / self.rho)
        self.host.set_server_privacy(privacy)

    def encoder_row(self, name: str, prev: Tensor, trained: Tensor, layout: FlatLayout) -> Tensor:
        """The host's rows of the masked update: Δ' = mask(Δ), "trained" = prev + Δ'. A client
        the host leaves as it is (``encoder_scope: none``) keeps its own, unmasked encoder at
        when its receipt is applied, whatever this row (the host's ``receive`` ignores that row)."""
        if name not in ("trained", "delta") or self.rho == 1:  # ρ = 1: the host's own rows
            return self.host.encoder_row(name, prev, trained, layout)
        masked = self.transform((trained - prev)[None], layout)[0]
        return prev + masked if name == "trained" else masked

    def exchange(self, round_: int) -> Exchange:
        """The host's: a masked update travels as the dense row the engine exchanges (a sparse
        encoding, ⌈ρ·d⌉ values and their indices, would send less; fedmtl does not use one)."""
        return self.host.exchange(round_)

    def transform(self, deltas: Tensor, layout: FlatLayout) -> Tensor:
        """FedDEA's transform of a stack of updates [M, D]: per row (``unit``) or per parameter
        tensor of each row (``tensor``)."""
        if self.scope == "unit" or self.rho == 1:
            return feddea_mask(deltas, self.rho, self.rescale)
        out = deltas.new_empty(deltas.shape)
        for offset, numel in zip(layout.offsets, layout.numels, strict=True):
            part = slice(offset, offset + numel)
            out[:, part] = feddea_mask(deltas[:, part].contiguous(), self.rho, self.rescale)
        return out

    def __repr__(self) -> str:
        return f"FedDEA(rho={self.rho}, scope={self.scope!r}, rescale={self.rescale}, host={self.host!r})"


def check_host(host: Method) -> None:
    """Raise ValueError unless FedDEA is defined over ``host``: a method whose server step
    averages updates."""
    name = type(host).__name__
    if name in _NOT_AVERAGING:
        raise ValueError(
            f"algorithm.host: FedDEA is not defined over {name}, which {_NOT_AVERAGING[name]}; "
            f"use one of {list(HOSTS)}"
        )
    if name not in HOSTS:
        raise ValueError(f"algorithm.host must be one of {list(HOSTS)} (FedDEA's hosts), got {name}")


# The options a FedDEA took before its host was a nested method, which now belong to the host.
_FLAT_HOST_OPTIONS = (
    "mu",
    "server_optimizer",
    "server_lr",
    "beta1",
    "beta2",
    "tau",
    "encoder_scope",
    "decoder_scope",
    "head_scope",
    "weighted",
    "participation",
)


def nest_flat_host(algorithm: Any) -> Any:
    """A saved ``algorithm`` config of FedDEA in its earlier, flat form (``host: FedProx`` and
    the host's options beside ``rho``) rewritten with the host nested, so that runs written
    before the change still resume and validate; anything else is returned as it is."""
    if not isinstance(algorithm, dict) or not str(algorithm.get("class_path", "")).endswith("FedDEA"):
        return algorithm
    init_args = dict(algorithm.get("init_args") or {})
    if not isinstance(init_args.get("host", "FedAvg"), str):
        return algorithm
    flat = {k: init_args.pop(k) for k in _FLAT_HOST_OPTIONS if k in init_args}
    host_args = {k: v for k, v in flat.items() if v is not None}  # null: the host's default
    init_args["host"] = {"class_path": init_args.pop("host", "FedAvg"), "init_args": host_args}
    return {**algorithm, "init_args": init_args}


class _HostValue:
    """A property or plain class attribute of :class:`Method` (``evaluated``, ``reads_every_client``)
    that a FedDEA takes from its host; read on the class, it is Method's own (a property
    object, ``"post-aggregation"``), as for any other method."""

    def __init__(self, name: str, default: Any) -> None:
        self.name, self.default = name, default

    def __get__(self, obj: FedDEA | None, owner: type | None = None) -> Any:
        return self.default if obj is None else getattr(obj.host, self.name)


def _host_hook(name: str, hook: Any) -> Any:
    """:class:`Method`'s ``hook`` (a method, a property or a class attribute) answered by the host."""
    if not callable(hook):
        return _HostValue(name, hook)

    @functools.wraps(hook)
    def forward(self: FedDEA, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.host, name)(*args, **kwargs)

    return forward


# Every hook FedDEA does not define is the host's: the client behaviour, the run's checks and
# participation, the server state, the logs. Set on the class, not left to `__getattr__`,
# because Method gives every hook a default that `__getattr__` would never reach. `aggregate`
# stays Method's: it makes the rows with FedDEA's `encoder_row` and runs FedDEA's `server_step`.
for _name, _hook in {**vars(Aggregator), **vars(Method)}.items():
    if not _name.startswith("_") and _name not in vars(FedDEA) and _name != "aggregate":
        setattr(FedDEA, _name, _host_hook(_name, _hook))
