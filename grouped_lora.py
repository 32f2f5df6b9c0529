"""The LoRA layers of one input as one matrix product while sampling on the CPU.

A decoding step of a LoRA model runs each LoRA layer as three small products (the lean forward,
cpu_training.lean_lora_forward): the base weight, A, then B, 21 a decoder layer of seven LoRA layers. On the
CPU each product of a few rows costs a call and a pass over its output besides its weights' bytes. Four of the
seven read one input (q, k and v; gate and up), so here the layers of one input multiply it once by their base
weights and A matrices stacked in one buffer, then add each layer's B product into its share of that output
with one addmm: 11 products a decoder layer. The terms are the lean forward's; only the matrix library's
blocking of the larger product can round them differently.

The stacked base weights are the model's own: each base layer's weight becomes a view of its group's buffer
the first time, so the buffer costs the A matrices' rows only. A matrices are copied in at every call, as the
optimizer changes them. A group is made again when one of its base weights was replaced since (a move to
another dtype or device)."""

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch

import packed_weights

# Sibling layers that read one input in the decoders of the Llama family (Qwen2 included).
SHARED_INPUT = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def lean_adapter(layer: torch.nn.Module) -> str | None:
    """The adapter of a PEFT LoRA Linear layer whose terms can be multiplied without PEFT's forward (here in a
    group, in cpu_training.lean_lora_forward alone): adapters on and unmerged, one active adapter, no variant
    (DoRA), no bias on B and no hooks on A or B (neither path calls them as modules); None otherwise."""
    if layer.disable_adapters or layer.merged or len(layer.active_adapters) != 1:
        return None
    name = layer.active_adapters[0]
    if name not in layer.lora_A or name in layer.lora_variant:
        return None
    a, b = layer.lora_A[name], layer.lora_B[name]
    if b.bias is not None or any(m._forward_hooks or m._forward_pre_hooks for m in (a, b)):
        return None
    return name


def plain_adapter(layer: torch.nn.Module) -> str | None:
    """The adapter of a PEFT LoRA Linear layer that a group can run: a lean_adapter, no forward of its own
    and no hooks on the base layer (a group calls neither), A and B in the base weight's dtype (PlainSampler's
    bf16 copies) and all on the CPU; None for every other module."""
    base = getattr(layer, "base_layer", None)
    if (
        not isinstance(base, torch.nn.Linear)
        or not isinstance(getattr(layer, "lora_A", None), torch.nn.ModuleDict)
        or "forward" in vars(layer)
        or base._forward_hooks
        or base._forward_pre_hooks
    ):
        return None
    name = lean_adapter(layer)
    weight = base.weight
    if name is None or weight.device.type != "cpu" or not weight.dtype.is_floating_point:
        return None
    a, b = layer.lora_A[name].weight, layer.lora_B[name].weight
    return name if a.dtype == b.dtype == weight.dtype else None


def shared_input_groups(model: torch.nn.Module) -> list[tuple[torch.nn.Module, ...]]:
    """The model's plain LoRA layers in groups of one input: the siblings of SHARED_INPUT where all of a set
    are plain and alike in input width, dtype and adapter; every other plain LoRA layer alone."""
    groups: list[tuple[torch.nn.Module, ...]] = []
    for parent in model.modules():
        children = dict(parent.named_children())
        for names in SHARED_INPUT:
            layers = tuple(children.get(name) for name in names)
            if all(layer is not None and plain_adapter(layer) for layer in layers):
                alike = {
                    (layer.in_features, layer.base_layer.weight.dtype, plain_adapter(layer))
                    for layer in layers
                }
                if len(alike) == 1:
                    groups.append(layers)
    grouped = {id(layer) for layers in groups for layer in layers}
    groups += [(m,) for m in model.modules() if id(m) not in grouped and plain_adapter(m)]
    return groups


def holds(buffer: torch.Tensor, weight: torch.Tensor, row: int) -> bool:
    """Whether `weight` is the view of `buffer` from `row` on."""
    return (
        weight.device == buffer.device
        and weight.dtype == buffer.dtype
        and weight.is_contiguous()
        and weight.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
        and weight.storage_offset() == buffer.storage_offset() + row * buffer.shape[1]
    )


class SharedInput:
    """One group's layers run as one product: `buffer` holds their base weights, then their A matrices. The
    outputs of a call are kept for the group's other layers until they are called with the same input."""

    def __init__(self, layers: tuple[torch.nn.Module, ...], buffers: dict) -> None:
        self.layers = layers
        self.adapter = plain_adapter(layers[0])
        self.outs = [layer.base_layer.weight.shape[0] for layer in layers]
        self.ranks = [layer.lora_A[self.adapter].weight.shape[0] for layer in layers]
        self.buffer = self.stacked(buffers)
        biases = [layer.base_layer.bias for layer in layers]
        self.bias = None
        if any(b is not None for b in biases):
            parts = [
                b.detach() if b is not None else self.buffer.new_zeros(n)
                for b, n in zip(biases, self.outs, strict=True)
            ]
            self.bias = torch.cat([*parts, self.buffer.new_zeros(sum(self.ranks))])
        self.input: torch.Tensor | None = None
        self.ready: dict[int, torch.Tensor] = {}

    def stacked(self, buffers: dict) -> torch.Tensor:
        """The group's buffer (kept in `buffers` from call to call), its base weights views of it, its A rows
        copied from the adapter's A matrices now."""
        weights = [layer.base_layer.weight for layer in self.layers]
        buffer = buffers.get(self.layers)
        starts = [sum(self.outs[:i]) for i in range(len(self.outs))]
        if buffer is None or not all(holds(buffer, w, row) for w, row in zip(weights, starts, strict=True)):
            buffer = weights[0].new_empty(sum(self.outs) + sum(self.ranks), weights[0].shape[1])
            for weight, row, out in zip(weights, starts, self.outs, strict=True):
                buffer[row : row + out].copy_(weight.detach())
                weight.data = buffer[row : row + out]
            buffers[self.layers] = buffer
        a_rows = buffer[sum(self.outs) :]
        with torch.no_grad():
            torch.cat([layer.lora_A[self.adapter].weight for layer in self.layers], out=a_rows)
        return buffer

    def forward(self, index: int, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        layer = self.layers[index]
        dropout = layer.lora_dropout[self.adapter]
        if (
            args
            or kwargs
            or torch.is_grad_enabled()
            or x.device.type != "cpu"
            or x.dtype != self.buffer.dtype
            or layer.disable_adapters
            or layer.merged
            or (dropout.training and not isinstance(dropout, torch.nn.Identity))
        ):
            return type(layer).forward(layer, x, *args, **kwargs)
        if x is not self.input or index not in self.ready:
            self.input, self.ready = x, dict(enumerate(self.outputs(x)))
        output = self.ready.pop(index)
        if not self.ready:
            self.input = None
        return output

    def outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Each layer's output for `x`: base plus scaling x (x A) B, in the order of the layers."""
        flat = packed_weights.linear(x.reshape(-1, x.shape[-1]), self.buffer, self.bias)
        parts = flat.split(self.outs + self.ranks, dim=1)
        n = len(self.layers)
        return [
            torch.addmm(
                parts[i],
                parts[n + i],
                layer.lora_B[self.adapter].weight.t(),
                alpha=layer.scaling[self.adapter],
            ).view(*x.shape[:-1], self.outs[i])
            for i, layer in enumerate(self.layers)
        ]


@contextmanager
def grouped_lora(model: torch.nn.Module, buffers: dict) -> Iterator[None]:
    """While open, the model's plain LoRA layers on the CPU run in their groups of one input under no_grad
    (any other call goes to the layer's own forward); `buffers` keeps the groups' buffers between calls."""
    installed = []
    for layers in shared_input_groups(model):
        group = SharedInput(layers, buffers)
        for index, layer in enumerate(layers):
            layer.forward = partial(group.forward, index)
            installed.append(layer)
    try:
        yield
    finally:
        for layer in installed:
            del layer.forward
