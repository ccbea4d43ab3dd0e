"""Flat parameter buffers: a module's parameters as one 1-D tensor, and back.

The server works on stacked flat vectors ([clients, numel]) so that an aggregation is a
handful of batched tensor ops, not Python loops over clients and parameter tensors. A
:class:`FlatLayout` records where each parameter lives in the vector and which *layer* owns
it: the submodule holding it directly, from :func:`parameter_layers`. So
per-layer quantities (FedHCA²'s β, one per decoder layer) come from module structure, never
from the spelling of state_dict keys.

Only parameters are laid out. Buffers such as BatchNorm running statistics stay local
(the HC-FMTL setting: docs/index.md, "The setting").

    layout = FlatLayout.from_module(model.encoder)
    prev = layout.stack([m.encoder for m in models])   # [N, P]
    ...                                                # train, aggregate
    layout.assign(models[i].encoder, new[i])           # the engine writes results back
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

Source = nn.Module | Mapping[str, Tensor]


@dataclass(frozen=True)
class FlatLayout:
    """Where each parameter tensor lives in a flat vector, and the layer it belongs to.

    Tensors are laid out back to back in ``names`` order (``named_parameters()`` order for
    :meth:`from_module`). Two modules of the same structure have equal layouts, so
    ``FlatLayout.from_module(a) == FlatLayout.from_module(b)`` checks that their flat
    vectors can be stacked and averaged.
    """

    names: tuple[str, ...]  # parameter names, relative to the module the layout describes
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]  # of the module's parameters; flat vectors may differ
    tensor_layers: tuple[str, ...]  # per tensor: the qualified name of the submodule owning it
    # Derived in __post_init__.
    numels: tuple[int, ...] = field(init=False, repr=False, compare=False)
    offsets: tuple[int, ...] = field(init=False, repr=False, compare=False)  # start of each tensor
    numel: int = field(init=False, repr=False, compare=False)  # length of the flat vector
    layers: tuple[str, ...] = field(init=False, repr=False, compare=False)  # unique, first-seen order
    tensor_layer_ids: tuple[int, ...] = field(init=False, repr=False, compare=False)  # into `layers`

    def __post_init__(self) -> None:
        names, layers = tuple(self.names), tuple(self.tensor_layers)
        shapes = tuple(tuple(int(s) for s in shape) for shape in self.shapes)
        dtypes = tuple(self.dtypes)
        if not names:
            raise ValueError("a FlatLayout needs at least one tensor")
        if not len(names) == len(shapes) == len(dtypes) == len(layers):
            raise ValueError(
                f"names, shapes, dtypes and tensor_layers must have one entry per tensor; got "
                f"{len(names)}, {len(shapes)}, {len(dtypes)} and {len(layers)}"
            )
        if len(set(names)) != len(names):
            raise ValueError(f"tensor names must be unique, got {list(names)}")
        numels = tuple(_numel(shape) for shape in shapes)
        offsets = tuple(sum(numels[:i]) for i in range(len(numels)))
        unique_layers = tuple(dict.fromkeys(layers))
        layer_id = {name: i for i, name in enumerate(unique_layers)}
        for attr, value in [
            ("names", names),
            ("shapes", shapes),
            ("dtypes", dtypes),
            ("tensor_layers", layers),
            ("numels", numels),
            ("offsets", offsets),
            ("numel", sum(numels)),
            ("layers", unique_layers),
            ("tensor_layer_ids", tuple(layer_id[name] for name in layers)),
        ]:
            object.__setattr__(self, attr, value)

    @classmethod
    def from_module(cls, module: nn.Module) -> FlatLayout:
        """The layout of ``module``'s parameters (not its buffers), in ``named_parameters()`` order."""
        # Owner by identity: a parameter shared by two modules belongs to the first, as
        # named_parameters() lists it once, under its first name.
        owner: dict[int, str] = {}
        for layer_name, layer in parameter_layers(module).items():
            for p in layer.parameters(recurse=False):
                owner.setdefault(id(p), layer_name)
        named = list(module.named_parameters())
        if not named:
            raise ValueError(f"{type(module).__name__} has no parameters to lay out")
        return cls(
            names=tuple(n for n, _ in named),
            shapes=tuple(tuple(p.shape) for _, p in named),
            dtypes=tuple(p.dtype for _, p in named),
            tensor_layers=tuple(owner[id(p)] for _, p in named),
        )

    @property
    def num_tensors(self) -> int:
        return len(self.names)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def nbytes(self, dtype: torch.dtype | None = None) -> int:
        """Bytes of the flat vector in ``dtype``, or with each tensor in its own dtype."""
        if dtype is not None:
            return self.numel * dtype.itemsize
        return sum(n * t.itemsize for n, t in zip(self.numels, self.dtypes, strict=True))

    # --- module <-> flat vector ---------------------------------------------------------

    def flatten(self, source: Source, dtype: torch.dtype | None = None) -> Tensor:
        """The parameters of ``source`` as one detached 1-D tensor [numel] (a new tensor).

        ``source`` is a module (its parameter names must match the layout exactly) or a
        mapping from name to tensor (extra keys, e.g. a state_dict's buffers, are ignored).
        The result is on the tensors' device, in ``dtype`` or else their promoted dtype.
        """
        parts = self._parts(source, dtype)
        return torch.cat(parts)

    def stack(self, sources: Sequence[Source], dtype: torch.dtype | None = None) -> Tensor:
        """``flatten`` of each source, stacked: [len(sources), numel] (each row written once)."""
        if not sources:
            raise ValueError("stack needs at least one source")
        rows = [self._parts(s, dtype) for s in sources]
        first = rows[0]
        out = torch.empty(len(rows), self.numel, dtype=first[0].dtype, device=first[0].device)
        for row, parts in zip(out, rows, strict=True):
            torch.cat(parts, out=row)
        return out

    def unflatten(self, vector: Tensor) -> dict[str, Tensor]:
        """Views of ``vector`` [..., numel] as the named tensors, each [..., *shape].

        Leading dimensions are kept, so a stack [M, numel] gives tensors [M, *shape].
        Writing to a view writes to ``vector``.
        """
        self._check_last_dim(vector, "unflatten")
        lead = vector.shape[:-1]
        return {
            name: part.view(*lead, *shape)
            for name, part, shape in zip(self.names, self.split(vector), self.shapes, strict=True)
        }

    def split(self, vector: Tensor) -> tuple[Tensor, ...]:
        """Views of ``vector`` [..., numel], one per tensor, each [..., numel_t] (for per-tensor math)."""
        self._check_last_dim(vector, "split")
        return vector.split(self.numels, dim=-1)

    def assign(self, module: nn.Module, vector: Tensor) -> None:
        """Copy ``vector`` [numel] into ``module``'s parameters, in place and without autograd.

        For the engine to apply an aggregation's result; aggregators never call it. The
        parameters keep their identity, dtype and device (optimizer state stays attached);
        buffers are untouched.
        """
        if vector.ndim != 1:
            raise ValueError(f"assign takes one flat vector [numel], got shape {tuple(vector.shape)}")
        targets = self._tensors_of(module)
        views = self.unflatten(vector)
        with torch.no_grad():
            for name, target in zip(self.names, targets, strict=True):
                target.copy_(views[name])

    # --- per-tensor and per-layer reductions --------------------------------------------

    def tensor_index(self, device: torch.device | str | None = None) -> Tensor:
        """LongTensor [numel]: the tensor index (into ``names``) of every element."""
        ids = torch.arange(self.num_tensors, device=device)
        return self._repeat(ids)

    def layer_index(self, device: torch.device | str | None = None) -> Tensor:
        """LongTensor [numel]: the layer index (into ``layers``) of every element.

        Costs 8 bytes per element; made on demand, not stored.
        """
        ids = torch.tensor(self.tensor_layer_ids, dtype=torch.long, device=device)
        return self._repeat(ids)

    def tensor_sum(self, x: Tensor) -> Tensor:
        """Segment sums of ``x`` [..., numel] over each tensor: [..., num_tensors].

        E.g. per-tensor dot products of rows a and b: ``layout.tensor_sum(a * b)``.
        """
        self._check_last_dim(x, "tensor_sum")
        out = x.new_zeros(*x.shape[:-1], self.num_tensors)
        return out.index_add_(-1, self.tensor_index(x.device), x)

    def layer_sum(self, x: Tensor) -> Tensor:
        """Segment sums of ``x`` [..., numel] over each layer: [..., num_layers]."""
        self._check_last_dim(x, "layer_sum")
        out = x.new_zeros(*x.shape[:-1], self.num_layers)
        return out.index_add_(-1, self.layer_index(x.device), x)

    # --- helpers ------------------------------------------------------------------------

    def _repeat(self, ids: Tensor) -> Tensor:
        counts = torch.tensor(self.numels, dtype=torch.long, device=ids.device)
        return torch.repeat_interleave(ids, counts, output_size=self.numel)

    def _parts(self, source: Source, dtype: torch.dtype | None) -> list[Tensor]:
        tensors = self._tensors_of(source)
        dtype = dtype or functools.reduce(torch.promote_types, (t.dtype for t in tensors))
        return [t.detach().reshape(-1).to(dtype) for t in tensors]

    def _tensors_of(self, source: Source) -> list[Tensor]:
        if isinstance(source, nn.Module):
            tensors = dict(source.named_parameters())
            known = set(self.names)
            extra = [n for n in tensors if n not in known]
            if extra:
                raise KeyError(
                    f"{type(source).__name__} has parameters the layout does not: {extra[:5]}"
                    f"{' ...' if len(extra) > 5 else ''}"
                )
        else:
            tensors = source
        missing = [n for n in self.names if n not in tensors]
        if missing:
            raise KeyError(
                f"missing tensors of the layout: {missing[:5]}{' ...' if len(missing) > 5 else ''}"
            )
        out = []
        for name, shape in zip(self.names, self.shapes, strict=True):
            tensor = tensors[name]
            if tuple(tensor.shape) != shape:
                raise ValueError(f"tensor {name!r} has shape {tuple(tensor.shape)}; the layout says {shape}")
            out.append(tensor)
        return out

    def _check_last_dim(self, x: Tensor, what: str) -> None:
        if x.ndim == 0 or x.shape[-1] != self.numel:
            raise ValueError(
                f"{what} takes a tensor [..., {self.numel}] (the layout's numel), got shape {tuple(x.shape)}"
            )


def parameter_layers(module: nn.Module) -> dict[str, nn.Module]:
    """The submodules that own parameters directly, by qualified name, in definition order.

    For the FCN decoder (``fedmtl.models.FCNDecoder``) these are its six layers; FedHCA² learns
    one β per layer. Only module structure decides, never the spelling of parameter names.
    """
    return {name: m for name, m in module.named_modules() if any(True for _ in m.parameters(recurse=False))}


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
