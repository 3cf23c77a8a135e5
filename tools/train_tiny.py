"""Train the tiny default Qwen3.5 model on Shakespeare's plays.

Not part of the package: needs torch and transformers (with ``Qwen3_5ForCausalLM``). Reads the
token files written by ``tools/prepare_shakespeare.py`` (``train.npy``, ``val.npy``, uint16) and
trains a small ``Qwen3_5ForCausalLM`` that uses every architecture feature (Gated DeltaNet and
gated full attention layers, GQA, partial multi-section rotary, nv > nk linear heads, tied
embeddings) for a fixed wall-clock budget. Keeps the weights with the best validation loss and
writes them in float32 with ``config.json`` and ``train_log.json``.

The corpus is small (about a million tokens), so a GPU can pass over it many times within a few
minutes: ``--max-epochs`` ends a run (and its cosine schedule) after that many passes, and
``--dropout`` adds dropout on the residual branches during training only (the architecture is
unchanged). ``--variants 10:0.0,20:0.1`` trains several such runs (max epochs : dropout) at once as
separate processes on the same device, each for the same budget, and keeps the one with the best
validation loss; ``train_log.json`` then lists every variant under ``variants``.

Usage::

    python tools/train_tiny.py --data .artifacts/shakespeare --out .artifacts/tiny --minutes 7
    python tools/train_tiny.py --data .artifacts/shakespeare --out /tmp/smoke --minutes 0.3 --device cpu
    python tools/train_tiny.py --data .artifacts/shakespeare --out out/tiny --minutes 7 \
        --variants 10:0.0,20:0.1,30:0.2,60:0.2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

L, F_ = "linear_attention", "full_attention"


def build_config(vocab_size: int):
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=8,
        layer_types=[L, L, L, F_, L, L, L, F_],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1e7,
            "partial_rotary_factor": 0.25,
            "mrope_section": [4, 2, 2],
            "mrope_interleaved": True,
        },
        bos_token_id=None,
        eos_token_id=0,
        pad_token_id=0,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="folder with train.npy and val.npy")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--minutes", type=float, required=True, help="wall-clock training budget")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--seq", type=int, default=512, help="tokens per training window")
    ap.add_argument("--batch", type=int, default=32, help="windows per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1, help="cosine floor, as a fraction of --lr")
    ap.add_argument("--warmup", type=int, default=100, help="linear warmup steps")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--eval-seconds", type=float, default=30.0, help="validate every this many seconds")
    ap.add_argument("--log-steps", type=int, default=20)
    ap.add_argument("--max-epochs", type=float, default=None, help="stop after this many passes over train.npy")
    ap.add_argument("--dropout", type=float, default=0.0, help="residual-branch dropout while training")
    ap.add_argument("--variants", default=None, help="train MAX_EPOCHS:DROPOUT,... at once; keep the best")
    ap.add_argument("--max-shard-size", default=None, help="shard model.safetensors (e.g. 12MB)")
    args = ap.parse_args()
    if args.variants:
        sweep(args)
    else:
        train(args)


def sweep(args: argparse.Namespace) -> None:
    """Run one training process per variant, concurrently, and keep the best by validation loss."""
    variants = [tuple(float(x) for x in v.split(":")) for v in args.variants.split(",")]
    work = Path(tempfile.mkdtemp(prefix="tiny-sweep-"))
    base = [a for a in sys.argv[1:]]
    drop = {"--variants", "--out", "--max-epochs", "--dropout"}
    cmd_base: list[str] = []
    i = 0
    while i < len(base):  # forward every option but the ones each variant sets itself
        a = base[i]
        key = a.split("=", 1)[0]
        if key in drop:
            i += 1 if "=" in a else 2
            continue
        cmd_base.append(a)
        i += 1
    threads = str(max(1, (os.cpu_count() or 4) // len(variants)))
    procs = []
    for k, (epochs, dropout) in enumerate(variants):
        out = work / f"v{k}"
        cmd = [sys.executable, "-u", __file__, *cmd_base, "--out", str(out), "--max-epochs", str(epochs),
               "--dropout", str(dropout)]
        env = dict(os.environ, OMP_NUM_THREADS=threads)
        log = open(work / f"v{k}.log", "w")
        print(f"[sweep] v{k}: max_epochs {epochs} dropout {dropout}: {' '.join(cmd)}", flush=True)
        procs.append((k, epochs, dropout, out, log, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)))
    results = []
    for k, epochs, dropout, out, log, proc in procs:
        rc = proc.wait()
        log.close()
        text = (work / f"v{k}.log").read_text()
        print(f"===== v{k} (max_epochs {epochs}, dropout {dropout}) rc {rc} =====\n{text}", flush=True)
        tl = out / "train_log.json"
        if rc == 0 and tl.exists():
            results.append((json.loads(tl.read_text()), k, out))
    if not results:
        raise SystemExit("[sweep] every variant failed")
    summary = [
        {key: r[key] for key in ("max_epochs", "dropout", "val_loss", "val_loss_step", "val_loss_last", "steps",
                                 "tokens_seen", "epochs", "wall_seconds")} | {"variant": k}
        for r, k, _ in results
    ]
    best_log, best_k, best_out = min(results, key=lambda r: r[0]["val_loss"])
    args.out.mkdir(parents=True, exist_ok=True)
    for f in best_out.iterdir():
        if f.name != "train_log.json":
            shutil.copy2(f, args.out / f.name)
    best_log["variant"] = best_k
    best_log["variants"] = summary
    (args.out / "train_log.json").write_text(json.dumps(best_log, indent=2) + "\n")
    for row in summary:
        print(f"[sweep] {row}", flush=True)
    print(f"[sweep] kept v{best_k}: val_loss {best_log['val_loss']:.4f}; saved {args.out}", flush=True)


def add_residual_dropout(model, p: float) -> None:
    """Dropout on each mixer's and MLP's output (before the residual add), active in train mode only."""

    def hook(module, inputs, output):
        if isinstance(output, tuple):
            return (F.dropout(output[0], p, module.training), *output[1:])
        return F.dropout(output, p, module.training)

    for layer in model.model.layers:
        mixer = layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn
        mixer.register_forward_hook(hook)
        layer.mlp.register_forward_hook(hook)


def train(args: argparse.Namespace) -> None:

    import transformers
    from transformers import Qwen3_5ForCausalLM

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    device = torch.device(args.device)
    use_cuda = device.type == "cuda"
    gpu = torch.cuda.get_device_name(device) if use_cuda else None
    if use_cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    print(
        f"python {platform.python_version()} torch {torch.__version__} transformers {transformers.__version__} "
        f"device {device} {gpu or platform.processor()}",
        flush=True,
    )

    train = np.load(args.data / "train.npy").astype(np.int64)
    val = np.load(args.data / "val.npy").astype(np.int64)
    meta_path = args.data / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    vocab_size = int(meta.get("vocab_size", 4096))
    assert train.max() < vocab_size and val.max() < vocab_size
    print(f"train tokens {train.size:,}  val tokens {val.size:,}  vocab {vocab_size}", flush=True)

    config = build_config(vocab_size)
    model = Qwen3_5ForCausalLM(config).to(device=device, dtype=torch.float32)
    if args.dropout > 0:
        add_residual_dropout(model, args.dropout)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters {n_params:,}", flush=True)

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim >= 2 and "embed_tokens" not in name else no_decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=use_cuda,
    )

    train_t = torch.from_numpy(train)
    val_windows = torch.from_numpy(val[: (val.size - 1) // args.seq * args.seq + 1])
    budget = args.minutes * 60.0
    max_tokens = args.max_epochs * train.size if args.max_epochs else float("inf")

    def progress(elapsed: float, tokens: int) -> float:
        return max(elapsed / budget, tokens / max_tokens)

    def lr_at(step: int, elapsed: float, tokens: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        frac = min(progress(elapsed, tokens), 1.0)
        floor = args.lr * args.min_lr_frac
        return floor + 0.5 * (args.lr - floor) * (1.0 + math.cos(math.pi * frac))

    def autocast():
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=True)

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        starts = rng.integers(0, train.size - args.seq - 1, size=args.batch)
        idx = torch.from_numpy(starts)[:, None] + torch.arange(args.seq + 1)[None, :]
        w = train_t[idx].to(device, non_blocking=True)
        return w[:, :-1], w[:, 1:]

    @torch.no_grad()
    def evaluate() -> float:
        model.eval()
        n = (val_windows.numel() - 1) // args.seq
        x = val_windows[:-1].view(n, args.seq)
        y = val_windows[1:].view(n, args.seq)
        total, count = 0.0, 0
        for i in range(0, n, args.batch):
            xb, yb = x[i : i + args.batch].to(device), y[i : i + args.batch].to(device)
            with autocast():
                logits = model(input_ids=xb, use_cache=False).logits
            total += F.cross_entropy(logits.float().view(-1, vocab_size), yb.reshape(-1), reduction="sum").item()
            count += yb.numel()
        model.train()
        return total / count

    history: list[dict] = []
    best = {"val_loss": float("inf"), "step": 0, "tokens": 0, "seconds": 0.0, "state": None}

    def record_eval(step: int, tokens: int, elapsed: float, train_loss: float | None) -> float:
        v = evaluate()
        history.append({"step": step, "seconds": round(elapsed, 1), "train_loss": train_loss, "val_loss": v})
        mark = ""
        if v < best["val_loss"]:
            best.update(val_loss=v, step=step, tokens=tokens, seconds=round(elapsed, 1), state={k: t.detach().to("cpu", copy=True) for k, t in model.state_dict().items()})
            mark = " *"
        print(f"[eval] step {step} t {elapsed:.0f}s val_loss {v:.4f} ppl {math.exp(v):.1f}{mark}", flush=True)
        return v

    step, tokens = 0, 0
    run_loss, run_n = 0.0, 0
    last_train_loss = None
    t0 = time.time()
    last_eval = t0
    last_log = t0
    tok_since_log = 0
    while True:
        elapsed = time.time() - t0
        if progress(elapsed, tokens) >= 1.0:
            break
        lr = lr_at(step, elapsed, tokens)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = get_batch()
        with autocast():
            logits = model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits.float().view(-1, vocab_size), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += x.numel()
        tok_since_log += x.numel()
        run_loss = run_loss + loss.detach()
        run_n += 1
        if step % args.log_steps == 0 or step <= 3:
            now = time.time()
            last_train_loss = float(run_loss) / run_n
            print(
                f"step {step:6d} t {now - t0:6.1f}s lr {lr:.2e} loss {last_train_loss:.4f} "
                f"tok/s {tok_since_log / max(now - last_log, 1e-9):,.0f} epochs {tokens / train.size:.2f}",
                flush=True,
            )
            run_loss, run_n, tok_since_log, last_log = 0.0, 0, 0, now
        if time.time() - last_eval >= args.eval_seconds:
            record_eval(step, tokens, time.time() - t0, last_train_loss)
            last_eval = time.time()
    train_seconds = time.time() - t0
    final_val = record_eval(step, tokens, train_seconds, last_train_loss)

    model.load_state_dict(best["state"])
    model = model.to("cpu", dtype=torch.float32)
    args.out.mkdir(parents=True, exist_ok=True)
    save_kwargs = {"safe_serialization": True}
    if args.max_shard_size:
        save_kwargs["max_shard_size"] = args.max_shard_size
    model.save_pretrained(args.out, **save_kwargs)
    gen_cfg = args.out / "generation_config.json"
    if gen_cfg.exists():  # the tokenizer folder supplies the shipped one
        gen_cfg.unlink()

    log = {
        "val_play": meta.get("val_play"),
        "val_loss": best["val_loss"],
        "val_loss_step": best["step"],
        "val_loss_tokens": best["tokens"],
        "val_loss_seconds": best["seconds"],
        "val_loss_last": final_val,
        "train_loss_last": last_train_loss,
        "steps": step,
        "tokens_seen": tokens,
        "epochs": tokens / train.size,
        "train_tokens": int(train.size),
        "val_tokens": int(val.size),
        "wall_seconds": round(train_seconds, 1),
        "budget_minutes": args.minutes,
        "seed": args.seed,
        "seq": args.seq,
        "batch": args.batch,
        "lr": args.lr,
        "min_lr_frac": args.min_lr_frac,
        "warmup_steps": args.warmup,
        "weight_decay": args.weight_decay,
        "max_epochs": args.max_epochs,
        "dropout": args.dropout,
        "parameters": n_params,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "gpu": gpu,
        "history": history,
    }
    (args.out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")
    print(
        f"done: {step} steps, {tokens:,} tokens ({tokens / train.size:.1f} epochs) in {train_seconds:.0f}s; "
        f"best val_loss {best['val_loss']:.4f} at step {best['step']} (last {final_val:.4f}); saved {args.out}",
        flush=True,
    )


if __name__ == "__main__":
    main()
