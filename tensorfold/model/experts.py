"""The routed experts of an MoE checkpoint, gathered from whichever layout it stores them in.

Three layouts exist (names after the canonical prefix, for the sparse block of layer i at `layers.i.mlp.`):

    HF per-expert   experts.{e}.gate_proj.weight, .up_proj.weight [I, D], .down_proj.weight [D, I]   (transformers)
    HF fused        experts.gate_up_proj [E, 2 I, D] (gate rows, then up rows), experts.down_proj [E, D, I]
    MLX stacked     switch_mlp.gate_proj.weight, .up_proj.weight [E, I, D], .down_proj.weight [E, D, I], each with
                    .scales and .biases when quantized (mlx-lm's conversion splits the fused gate_up_proj)

`gather_experts` rewrites the first and third into the second, the form the loader knows (`sparse_shapes`): each
stored tensor stays where it is, read only when the loader reads the joined one.
"""
import numpy as np

from tensorfold.errors import CheckpointError


class Joined:
    """Stored tensors read as one: concatenated along `axis`, or stacked along a new first axis (`axis` None).
    Quacks like safetensors_io.TensorInfo (name, dtype, shape, read); its name is the first part's, so an error
    about it names a tensor that is in the file."""

    def __init__(self, parts: list, axis: int | None):
        first = parts[0]
        for part in parts[1:]:
            if part.dtype != first.dtype:
                raise CheckpointError(f"tensor {part.name}: dtype {part.dtype}, but {first.name} is {first.dtype}")
            if len(part.shape) != len(first.shape) or (axis is None and part.shape != first.shape) or any(
                    a != b for n, (a, b) in enumerate(zip(part.shape, first.shape)) if n != axis):
                raise CheckpointError(f"tensor {part.name}: shape {list(part.shape)} does not fit beside {first.name}"
                                      f" {list(first.shape)}")
        self.parts, self.axis, self.name, self.dtype = parts, axis, first.name, first.dtype
        if axis is None:
            self.shape = (len(parts),) + tuple(first.shape)
        else:
            self.shape = tuple(sum(p.shape[n] for p in parts) if n == axis else size
                               for n, size in enumerate(first.shape))

    def read(self) -> np.ndarray:
        arrays = [part.read() for part in self.parts]
        return np.stack(arrays) if self.axis is None else np.concatenate(arrays, self.axis)


def gather_experts(found: dict, config) -> None:
    """Rewrite `found` (canonical name -> stored tensor) in place so that every layer's experts are under the fused
    names `experts.gate_up_proj` and `experts.down_proj` (with their `.scales` and `.biases` when quantized)."""
    for i in range(config.num_hidden_layers):
        p = f"layers.{i}.mlp."
        if p + "switch_mlp.gate_proj.weight" in found:
            _gather_stacked(found, p, config)
        elif p + "experts.0.gate_proj.weight" in found:
            _gather_per_expert(found, p, config)


def _gather_stacked(found: dict, p: str, config) -> None:
    """MLX's switch_mlp: gate and up joined along their rows, expert by expert; down renamed."""
    gate, up = p + "switch_mlp.gate_proj.", p + "switch_mlp.up_proj."
    if up + "weight" not in found:
        raise CheckpointError(f"missing tensor {p}switch_mlp.up_proj.weight (beside {found[gate + 'weight'].name})")
    if config.quantization is not None and (gate + "scales" in found):
        specs = [config.quantization.spec_for(found[m + "weight"].name.removesuffix(".weight")) for m in (gate, up)]
        if specs[0] != specs[1]:
            raise CheckpointError(f"tensor {found[up + 'weight'].name}: quantized as {specs[1]}, but its gate_proj as"
                                  f" {specs[0]}; an expert's gate and up must share one form")
    for part in ("weight", "scales", "biases"):
        if gate + part in found or up + part in found:
            if gate + part not in found or up + part not in found:
                present = found.get(gate + part) or found.get(up + part)
                raise CheckpointError(f"tensor {present.name}: its partner among gate_proj and up_proj lacks "
                                      f".{part}")
            name = p + "experts.gate_up_proj" + ("" if part == "weight" else "." + part)
            found[name] = Joined([found.pop(gate + part), found.pop(up + part)], axis=1)
        down = p + "switch_mlp.down_proj." + part
        if down in found:
            found[p + "experts.down_proj" + ("" if part == "weight" else "." + part)] = found.pop(down)


def _gather_per_expert(found: dict, p: str, config) -> None:
    """transformers' per-expert tensors: each expert's gate and up joined, then the experts stacked."""
    gate_up, down, experts = [], [], config.num_experts
    width, hidden = config.moe_intermediate_size, config.hidden_size
    for e in range(experts):
        names = [f"{p}experts.{e}.{proj}_proj.weight" for proj in ("gate", "up", "down")]
        for name, shape in zip(names, ((width, hidden), (width, hidden), (hidden, width))):
            if name not in found:
                raise CheckpointError(f"missing tensor {name} (the model has {experts} experts)")
            if found[name].shape != shape:
                raise CheckpointError(f"tensor {found[name].name}: shape {list(found[name].shape)}, expected "
                                      f"{list(shape)}")
        gate_up.append(Joined([found.pop(names[0]), found.pop(names[1])], axis=0))
        down.append(found.pop(names[2]))
    found[p + "experts.gate_up_proj"] = Joined(gate_up, axis=None)
    found[p + "experts.down_proj"] = Joined(down, axis=None)
