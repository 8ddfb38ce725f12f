"""K models of one architecture as one module, and an optimizer with each member's own settings.

A fused array (HFTA's "horizontally fused training array", issue 44) trains K trials whose
models share a shape with one forward and one backward per step. :class:`FusedSequential`
takes K built ``nn.Sequential`` models (each initialized with its own trial's seed) and holds
their parameters side by side: a ``Conv2d`` becomes one grouped convolution over the K
members' channels, a ``Linear`` one batched matrix product (``torch.baddbmm``), and the
element-wise layers (ReLU, pooling, dropout) act on the members' activations together. The
members never mix: member ``k``'s output depends on member ``k``'s parameters and input only.

:class:`MemberOptimizer` steps every member with its own learning rate, weight decay and
momentum (or Adam's moments), the arithmetic of ``torch.optim.SGD``, ``Adam`` and ``AdamW``
written over a leading member dimension; an optimizer written here because torch's apply one
set of hyperparameters to a tensor, and a fused tensor holds K members.

Example:
    >>> import torch
    >>> from torch import nn
    >>> members = []
    >>> for seed in (0, 1):
    ...     _ = torch.manual_seed(seed)
    ...     members.append(nn.Sequential(nn.Flatten(), nn.Linear(4, 3)))
    >>> fused = FusedSequential(members)
    >>> x = torch.randn(2, 5, 4)                      # (members, batch, features)
    >>> out = fused(x)
    >>> out.shape, torch.allclose(out[1], members[1](x[1]), atol=1e-6)
    (torch.Size([2, 5, 3]), True)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from trainables.torch.data import Standardize

State = dict[str, torch.Tensor]  # one fused parameter's optimizer state
ELEMENTWISE = (nn.ReLU, nn.GELU, nn.Tanh, nn.Identity)
"""Layers that act on each value alone: the same module serves every member."""


class FusedSequential(nn.Module):
    """K ``nn.Sequential`` models of one architecture (Standardize, Conv2d, Linear, Flatten,
    MaxPool2d and the :data:`ELEMENTWISE` layers) as one module.

    ``forward`` takes ``(K, B, ...)``, each member's own batch, and returns ``(K, B, out)``.
    Images travel as ``(B, K*C, H, W)`` (member ``k``'s channels ``k*C`` to ``(k+1)*C``),
    vectors as ``(K, B, F)``. :meth:`member_state` gives back a member's ``state_dict`` with
    the unfused model's keys, so its checkpoint and export are the unfused trial's.
    """

    def __init__(self, members: Sequence[nn.Sequential]) -> None:
        super().__init__()
        self.k = len(members)
        first = members[0]
        if any(len(m) != len(first) for m in members):
            raise ValueError("fused members differ in their layers")
        self.layers = nn.ModuleList()
        self.names: list[str] = []  # each layer's index in the unfused Sequential
        for i, layer in enumerate(first):
            same = [m[i] for m in members]
            self.layers.append(self._fuse(layer, same))
            self.names.append(str(i))

    def _fuse(self, layer: nn.Module, same: list[nn.Module]) -> nn.Module:
        if isinstance(layer, nn.Conv2d):
            return _GroupedConv(same)  # type: ignore[arg-type]
        if isinstance(layer, nn.Linear):
            return _BatchedLinear(same)  # type: ignore[arg-type]
        if isinstance(layer, nn.Dropout):
            return MemberDropout([float(m.p) for m in same])  # type: ignore[arg-type,attr-defined]
        if isinstance(layer, (*ELEMENTWISE, nn.MaxPool2d, nn.Flatten, Standardize)):
            return layer
        raise TypeError(f"a fused array cannot hold a {type(layer).__name__} layer yet")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, b = x.shape[:2]
        if x.ndim == 5:  # (K, B, C, H, W) -> (B, K*C, H, W)
            x = x.transpose(0, 1).reshape(b, k * x.shape[2], *x.shape[3:])
        for layer in self.layers:
            if isinstance(layer, Standardize):  # member-major channels: the C block K times
                x = (x - layer.mean.repeat(1, self.k, 1, 1)) / layer.std.repeat(1, self.k, 1, 1)
            elif isinstance(layer, nn.Flatten):
                x = x.reshape(b, self.k, -1).transpose(0, 1) if x.ndim == 4 else x
            else:
                x = layer(x)
        return x

    def member_params(self) -> list[tuple[nn.Parameter, bool]]:
        """Every fused parameter, and whether its members' tensors are weights (ndim > 1 in
        the unfused model: what L1 penalizes)."""
        out = []
        for layer in self.layers:
            if isinstance(layer, _GroupedConv | _BatchedLinear):
                out += [(layer.weight, True), (layer.bias, False)]
        return out

    def member_state(self, k: int) -> dict[str, torch.Tensor]:
        """Member ``k``'s parameters and buffers under the unfused ``nn.Sequential``'s keys."""
        state: dict[str, torch.Tensor] = {}
        for name, layer in zip(self.names, self.layers, strict=True):
            if isinstance(layer, _GroupedConv | _BatchedLinear):
                weight, bias = layer.member(k)
                state[f"{name}.weight"], state[f"{name}.bias"] = weight, bias
            elif isinstance(layer, Standardize):
                state[f"{name}.mean"], state[f"{name}.std"] = layer.mean, layer.std
        return {key: value.detach().clone() for key, value in state.items()}

    def load_member(self, k: int, model: nn.Sequential) -> None:
        """Puts ``model``'s parameters into slot ``k`` (a new trial takes a finished one's)."""
        for name, layer in zip(self.names, self.layers, strict=True):
            if isinstance(layer, _GroupedConv | _BatchedLinear):
                layer.load(k, model[int(name)])  # type: ignore[arg-type]
            elif isinstance(layer, MemberDropout):
                layer.p[k] = float(model[int(name)].p)  # type: ignore[arg-type]


class MemberDropout(nn.Module):
    """``nn.Dropout`` with each member's own probability ``p`` (a per-member knob): in
    training, each value of member ``k`` is zeroed with probability ``p[k]`` and the rest
    scaled by ``1 / (1 - p[k])``, torch's dropout; in evaluation, the identity.

    Example:
        >>> drop = MemberDropout([0.0, 0.5])
        >>> out = drop(torch.ones(2, 4, 1000))             # (members, batch, features)
        >>> bool((out[0] == 1).all()), sorted(out[1].unique().tolist())
        (True, [0.0, 2.0])
    """

    def __init__(self, ps: list[float]) -> None:
        super().__init__()
        self.p = torch.tensor(ps, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not bool((self.p > 0).any()):
            return x
        k = len(self.p)
        if x.ndim == 4:  # (B, K*C, H, W): member k's channels are the k-th block
            p = self.p.repeat_interleave(x.shape[1] // k).view(1, -1, 1, 1)
        else:  # (K, B, ...)
            p = self.p.view(k, *([1] * (x.ndim - 1)))
        p = p.to(x.device, x.dtype)
        keep = torch.rand_like(x) >= p
        return torch.where(keep, x / (1 - p), torch.zeros_like(x))


class _GroupedConv(nn.Module):
    """K ``Conv2d`` of one shape as one convolution with ``groups=K`` (weights concatenated
    along the output channels, which is the grouped kernel's layout)."""

    def __init__(self, convs: list[nn.Conv2d]) -> None:
        super().__init__()
        first = convs[0]
        if first.groups != 1 or first.bias is None:
            raise TypeError("a fused array holds Conv2d layers with a bias and groups=1")
        self.k, self.out = len(convs), first.out_channels
        self.stride, self.padding, self.dilation = first.stride, first.padding, first.dilation
        self.weight = nn.Parameter(torch.cat([c.weight.detach() for c in convs]).clone())
        self.bias = nn.Parameter(torch.cat([c.bias.detach() for c in convs]).clone())  # type: ignore[union-attr]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.conv2d(
            x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.k
        )

    def member(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = slice(k * self.out, (k + 1) * self.out)
        return self.weight[rows], self.bias[rows]

    @torch.no_grad()
    def load(self, k: int, conv: nn.Conv2d) -> None:
        weight, bias = self.member(k)
        weight.copy_(conv.weight)
        bias.copy_(conv.bias)  # type: ignore[arg-type]  # a bias there: checked when fused


class _BatchedLinear(nn.Module):
    """K ``Linear`` of one shape as one ``baddbmm``: weights ``(K, in, out)``, bias
    ``(K, 1, out)``, input ``(K, B, in)``."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.stack([m.weight.detach().t() for m in linears]).clone())
        self.bias = nn.Parameter(torch.stack([m.bias.detach()[None] for m in linears]).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)

    def member(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.weight[k].t(), self.bias[k, 0]

    @torch.no_grad()
    def load(self, k: int, linear: nn.Linear) -> None:
        self.weight[k].copy_(linear.weight.t())
        self.bias[k, 0].copy_(linear.bias)


def per_member(p: torch.Tensor, k: int) -> torch.Tensor:
    """``p`` (a fused parameter or its gradient) as ``(K, -1)``: row ``k`` is member ``k``'s."""
    return p.view(k, -1)


class MemberOptimizer:
    """SGD with momentum, Adam (coupled L2) or AdamW (decoupled decay) over fused parameters,
    each member its own family (``families``, set per slot), with each member's ``lr``,
    ``weight_decay`` and ``momentum`` (``(K,)`` tensors, set before each step, so a
    per-member schedule only writes ``lr``); Adam's betas and eps are torch's.

    The arithmetic is ``torch.optim``'s for one tensor (its ``foreach``-free path), so a
    member's update equals its unfused trial's to float rounding. An array of several
    families computes each family's update for the members of that family only (SGD's
    momentum buffer and Adam's moments are separate state). :meth:`reset` clears a slot's
    state when a new trial takes it.
    """

    def __init__(self, params: list[nn.Parameter], family: str | list[str], k: int) -> None:
        self.params, self.k = params, k
        self.families = [family] * k if isinstance(family, str) else list(family)
        self.lr = torch.zeros(k, dtype=torch.float64)  # cast to each parameter's dtype
        self.weight_decay = torch.zeros(k, dtype=torch.float64)
        self.momentum = torch.zeros(k, dtype=torch.float64)
        self.betas, self.eps = (0.9, 0.999), 1e-8
        self.steps = torch.zeros(k)
        self.state: list[dict[str, torch.Tensor]] = [{} for _ in params]

    def reset(self, k: int) -> None:
        """Slot ``k`` starts again: no momentum, no moments, step 0."""
        self.steps[k] = 0
        for state in self.state:
            for value in state.values():
                per_member(value, self.k)[k] = 0

    def _col(self, values: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return values.to(p.device, p.dtype).view(self.k, *([1] * (p.dim() - 1)))

    def _members(self, *families: str) -> torch.Tensor:
        return torch.tensor([f in families for f in self.families])

    @torch.no_grad()
    def step(self, active: torch.Tensor) -> None:
        """One update of the members where ``active`` (``(K,)`` bool) is set; the others'
        parameters and state stay as they are."""
        self.steps += active.float()
        sgd, adamw = self._members("sgd"), self._members("adamw")
        adam = ~sgd
        for p, state in zip(self.params, self.state, strict=True):
            if p.grad is None:
                continue
            g = p.grad.view(self.k, -1)
            w = p.view(self.k, -1)
            lr, wd = self._col(self.lr, g), self._col(self.weight_decay, g)
            on = self._col(active, g).bool()
            coupled = g + wd * w  # L2 in the gradient: sgd and adam
            updates = []
            if bool(sgd.any()):
                mask = self._col(sgd, g).bool()
                updates.append((mask, self._sgd(coupled, state, on & mask)))
            if bool(adam.any()):
                mask, decoupled = self._col(adam, g).bool(), self._col(adamw, g).bool()
                grad = torch.where(decoupled, g, coupled) if bool(adamw.any()) else coupled
                updates.append((mask, self._adam(grad, state, on & mask)))
                if bool(adamw.any()):
                    w.copy_(torch.where(on & decoupled, w * (1 - lr * wd), w))
            update = updates[0][1]
            if len(updates) == 2:
                update = torch.where(updates[0][0], updates[0][1], updates[1][1])
            w.copy_(torch.where(on, w - lr * update, w))

    def _sgd(
        self, g: torch.Tensor, state: dict[str, torch.Tensor], on: torch.Tensor
    ) -> torch.Tensor:
        if "buf" not in state:
            state["buf"] = torch.zeros_like(g)
        m = self._col(self.momentum, g)
        first = self._col(self.steps == 1, g).bool()
        buf = torch.where(first, g, m * state["buf"] + g)
        state["buf"].copy_(torch.where(on, buf, state["buf"]))
        return torch.where(m > 0, buf, g)

    def _adam(
        self, g: torch.Tensor, state: dict[str, torch.Tensor], on: torch.Tensor
    ) -> torch.Tensor:
        b1, b2 = self.betas
        for name in ("m", "v"):
            state.setdefault(name, torch.zeros_like(g))
        m = torch.where(on, state["m"].lerp(g, 1 - b1), state["m"])
        v = torch.where(on, b2 * state["v"] + (1 - b2) * g * g, state["v"])
        state["m"].copy_(m)
        state["v"].copy_(v)
        t = self._col(self.steps.clamp(min=1), g)
        c1, c2 = 1 - b1**t, 1 - b2**t
        return (m / c1) / (v.sqrt() / c2.sqrt() + self.eps)


def member_norms(params: list[nn.Parameter], k: int) -> torch.Tensor:
    """Each member's total L2 gradient norm over every fused parameter, ``(K,)``."""
    squares = [per_member(p.grad, k).pow(2).sum(1) for p in params if p.grad is not None]
    return torch.stack(squares).sum(0).sqrt() if squares else torch.zeros(k)


@torch.no_grad()
def clip_members(
    params: list[nn.Parameter], clip_norm: torch.Tensor, clip_value: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each member's gradients clipped by value, then by total norm (``torch.nn.utils``'
    ``clip_grad_value_`` and ``clip_grad_norm_``, with each member's bounds; 0 = off).

    Returns:
        Each member's norm before clipping and after it, ``(K,)`` each.
    """
    k = len(clip_norm)
    before = member_norms(params, k)
    clip_norm, clip_value = clip_norm.to(before), clip_value.to(before)  # onto the grads' device
    if not bool(((clip_norm > 0) | (clip_value > 0)).any()):
        return before, before
    bound = torch.where(clip_value > 0, clip_value, torch.full_like(clip_value, math.inf))
    for p in params:
        if p.grad is not None:
            g = per_member(p.grad, k)
            b = bound.to(g).view(k, 1)
            g.copy_(torch.maximum(torch.minimum(g, b), -b))
    after = member_norms(params, k)
    coef = torch.where(clip_norm > 0, (clip_norm / (after + 1e-6)).clamp(max=1.0), 1.0)
    for p in params:
        if p.grad is not None:
            per_member(p.grad, k).mul_(coef.to(p.grad).view(k, 1))
    clipped = (clip_norm > 0) | (clip_value > 0)
    return before, torch.where(clipped, member_norms(params, k), before)
