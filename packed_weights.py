"""The weights of a decoding step in oneDNN's own layout while sampling on the CPU.

A decoding step multiplies a few rows (16 at 2 prompts x 8 completions) by every weight of the model, so its
matrix products are bound by reading the weights. For a bf16 weight in PyTorch's row-major layout, oneDNN's
product of 16 rows read it at 7 to 9 GB/s on the 2-core box; from a copy reordered once into oneDNN's
blocked layout for the product (`torch.ops.mkldnn._reorder_linear_weight`, what inductor's CPU freezing does)
the same product read it at 12 to 17 GB/s, with the same bits in every product measured (1 to 2,000 rows,
with and without a bias; tests/test_packed_weights.py checks a model's sampled tokens and scores). A copy
costs the weight's
memory again and a reorder, so copies are kept only for a scope in which the weights do not change: one
`generate` call of the sampler (a training round), one evaluation (`held`). A float32 weight keeps PyTorch's
path: there the copy's products were not the same bits.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

# Each weight's (weight, copy) by the weight's id while a scope is open; None outside one.
copies: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None


@functools.cache
def supported() -> bool:
    """Whether this CPU's oneDNN multiplies bf16 (AVX-512 BF16 or AMX), which the copies are for."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


@contextmanager
def held() -> Iterator[None]:
    """A scope in which no weight changes: each weight multiplied by `linear` is reordered once in it, and
    the copies are dropped at its end. Reentrant: an inner scope (the sampler's call inside an evaluation)
    is the outer one."""
    global copies
    if copies is not None:
        yield
        return
    copies = {}
    try:
        yield
    finally:
        copies = None


def packable(weight: torch.Tensor) -> bool:
    """Whether `weight` is a bf16 CPU matrix on a CPU whose oneDNN multiplies bf16."""
    return (
        weight.dim() == 2 and weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and supported()
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), multiplied from the weight's reordered copy where a scope is open, no
    gradient is being recorded and both are bf16 on the CPU."""
    if copies is None or torch.is_grad_enabled() or x.dtype != torch.bfloat16 or not packable(weight):
        return F.linear(x, weight, bias)
    held_weight, copy = copies.get(id(weight), (None, None))
    if held_weight is not weight:
        copy = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())
        copies[id(weight)] = (weight, copy)
    return torch.ops.mkldnn._linear_pointwise(x, copy, bias, "none", [], "")


def packable_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The model's plain Linear layers with a packable weight and no forward of their own: the base layers of
    its LoRA, the LM head, every layer of a model without LoRA (which requires gradients it will not get
    here: a scope is what holds a weight still, not requires_grad)."""
    return [
        m
        for m in model.modules()
        if type(m) is torch.nn.Linear and packable(m.weight) and "forward" not in vars(m)
    ]


def linear_forward(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(x, layer.weight, layer.bias)


@contextmanager
def packed_linears(model: torch.nn.Module) -> Iterator[None]:
    """While open, the model's Linear layers (packable_linears) multiply through `linear`, in a scope (`held`)
    of their own unless one is open already. Calls with gradients go to F.linear as before."""
    layers = packable_linears(model)
    for layer in layers:
        layer.forward = functools.partial(linear_forward, layer)
    try:
        with held():
            yield
    finally:
        for layer in layers:
            del layer.forward
