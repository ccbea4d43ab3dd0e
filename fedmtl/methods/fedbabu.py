"""FedBABU (Oh et al., ICLR 2022) in HC-FMTL: heads frozen at initialisation, fine-tuned at the end."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from fedmtl.aggregation.base import ClientInfo
from fedmtl.methods.base import ClientContext, new_track, register_method
from fedmtl.methods.checks import integer_at_least, non_negative, positive
from fedmtl.methods.fedavg import FedAvg
from fedmtl.seeds import derive_seed
from fedmtl.tensors import load_into


@register_method
class FedBABU(FedAvg):
    """FedBABU as FedHCA² compares against it (suppl. C; docs/methods.md, FedBABU).

    During the R rounds the heads do not train: ``requires_grad=False`` and left out of the
    optimiser, so not even AdamW's weight decay moves them (a zeroed gradient would: the
    public FL-bench "freezes" that way). Each task's head starts from a seed of its own
    (run seed, dataset, task), so clients sharing a task share the frozen head, as FedBABU's
    single server-side initialisation. The encoders are averaged over all clients; decoders
    train locally and are not aggregated (the option FedHCA²'s text leaves open).

    After the last round each client fine-tunes a *copy* of its model — every parameter,
    a fresh AdamW at the client's lr and weight decay (or ``ft_lr`` / ``ft_weight_decay``),
    constant rate, ``ft_epochs`` epochs on its own shard. The copy is evaluated (the
    reported numbers); the model before fine-tuning is evaluated too (``federated``), and
    it, the server and the checkpoints' federated state are not changed by fine-tuning.

    Args:
        ft_epochs: fine-tuning epochs τ ≥ 0 (official code: 5); 0 evaluates the federated model.
        ft_lr: fine-tuning learning rate; None: the client's ``optimizer.lr`` (paper: 1e-4).
        ft_weight_decay: fine-tuning weight decay; None: the client's (paper: 1e-4).
        weighted: weigh the encoder average by sample counts (see :class:`FedAvg`).
        participation: fraction of the clients that train each round.
    """

    evaluated = "fine-tuned"
    also_evaluated = ("federated",)

    def __init__(
        self,
        ft_epochs: int = 5,
        ft_lr: float | None = None,
        ft_weight_decay: float | None = None,
        weighted: bool = False,
        participation: float = 1.0,
    ) -> None:
        super().__init__(
            encoder_scope="all", decoder_scope="none", weighted=weighted, participation=participation
        )
        integer_at_least("ft_epochs", ft_epochs, 0, " (fine-tuning epochs)")
        if ft_lr is not None:
            positive("ft_lr", ft_lr, " or null")
        if ft_weight_decay is not None:
            non_negative("ft_weight_decay", ft_weight_decay, " or null")
        self.ft_epochs = ft_epochs
        self.ft_lr = ft_lr
        self.ft_weight_decay = ft_weight_decay

    def init_client(self, model: nn.Module, client: ClientInfo, seed: int) -> dict[str, Any]:
        from fedmtl.models import reinitialise  # here: fedmtl.models imports timm, slow for `fit --help`

        for task, head in model.heads.items():
            # PyTorch's default initialisation from the task's own seed; the global random
            # state is restored afterwards, so nothing else the client draws changes.
            reinitialise(head, derive_seed(seed, "fedbabu-head", client.dataset, task))
        return {}

    def frozen(self, model: nn.Module, round_: int) -> list[nn.Module]:
        return [model.heads]

    def finish(self, ctx: ClientContext) -> None:
        load_into(ctx.model, ctx.state["model"])
        copy = new_track(ctx.model, epochs_done=ctx.state["epochs_done"])
        if self.ft_epochs > 0:
            config = dataclasses.replace(
                ctx.optimizer,
                lr=ctx.optimizer.lr if self.ft_lr is None else self.ft_lr,
                weight_decay=ctx.optimizer.weight_decay
                if self.ft_weight_decay is None
                else self.ft_weight_decay,
            )
            ctx.train(copy, epochs=self.ft_epochs, order="fine-tune", fine_tune=config)
        ctx.personal["fine_tuned"] = copy["model"]

    def evaluated_models(self, state: Mapping[str, Any]) -> dict[str, Mapping[str, Tensor]]:
        models = {"federated": state["model"]}
        if "fine_tuned" in state["personal"]:
            models = {"fine-tuned": state["personal"]["fine_tuned"], **models}
        return models

    def __repr__(self) -> str:
        return (
            f"FedBABU(ft_epochs={self.ft_epochs}, ft_lr={self.ft_lr}, ft_weight_decay={self.ft_weight_decay}, "
            f"weighted={self.weighted}, participation={self.participation})"
        )
