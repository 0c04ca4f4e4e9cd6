"""The PyTorch side of an export: a model's weights as numpy, and the model computing with exactly
the weights its graphs use (what validation and head training compare against)."""

from __future__ import annotations

import copy

import numpy as np

from edgespec.export.target.graph.writer import LlamaGraphWriter


def reference_model(model, writer: LlamaGraphWriter, copy_model: bool = True):
    """A copy of `model` computing with exactly the weights `writer`'s graphs use (int4: dequantized;
    a self:N draft: the first N layers). copy_model=False: `model` itself, changed (no second copy
    of its weights in memory)."""
    import torch

    ref = copy.deepcopy(model) if copy_model else model
    with torch.no_grad():
        params = dict(ref.named_parameters(remove_duplicate=False))
        for name, arr in writer.reference.items():
            set_weight(ref, params, name, arr)
        if writer.n_layers < ref.config.num_hidden_layers:
            ref.model.layers = ref.model.layers[: writer.n_layers]
            ref.config.num_hidden_layers = writer.n_layers
    if writer.opts.precision == "int8":  # the integer graph quantizes every linear's input rows too
        for module in ref.modules():
            if isinstance(module, torch.nn.Linear):
                module.register_forward_pre_hook(_quantize_rows)
    return ref.eval()


def set_weight(model, params: dict, name: str, arr: np.ndarray) -> None:
    """One weight of `model` (params: its named_parameters, duplicates kept) set to the values a
    graph computes with; the LM head untied (the graph's embedding Gather stays unquantized)."""
    import torch

    with torch.no_grad():
        if name == "lm_head.weight":
            model.lm_head.weight = torch.nn.Parameter(torch.from_numpy(np.array(arr)))
        elif name in params:
            params[name].copy_(torch.from_numpy(np.asarray(arr)))


class IntoModel(dict):
    """A graph writer's `reference` that copies each weight into a PyTorch model as the writer
    stores it and keeps nothing (empty as a dict): the reference without a second copy of the
    weights in memory (the streaming export's sampled model)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model
        self.params = dict(model.named_parameters(remove_duplicate=False))

    def __setitem__(self, name: str, arr: np.ndarray) -> None:
        set_weight(self.model, self.params, name, arr)


def _quantize_rows(module, args):
    """A linear's input as the integer graph sees it: each row rounded to int8 steps of its own
    scale max|x_r| / 127 (linears.IntegerLinears)."""
    import torch

    x = args[0]
    scale = torch.clamp(x.abs().amax(dim=-1, keepdim=True) * np.float32(1 / 127), min=1e-30)
    return (torch.round(x / scale) * scale,) + tuple(args[1:])
