"""python -m fusedattn demo: train a tiny causal transformer to reverse sequences.

Each example is [a_1 .. a_S, SEP, a_S .. a_1] with random tokens a_i; the model
reads it left to right and is scored only on predicting the reversed half. Token
j of that half must be fetched from position S-1-j, so the task is solvable only
through attention: accuracy stays at chance (1/vocab) unless fused_attn and its
backward kernel work. The exit code is 0 when held-out accuracy beats --min-acc,
so the demo doubles as an end-to-end smoke check.

--mesh dp=2,tp=2,cp=2 trains the same model sharded over a device mesh (on the CPU:
--cpu-devices 8 makes 8 virtual devices): the batch over dp, the attention heads over tp,
the sequence over cp (context parallelism, --cp-strategy ring or all_gather, load-balanced:
the token sequences are reordered in dual chunks once, and the model sees positions in
that order), and prints the mesh and the time per step.
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import fusedattn
from fusedattn import AttnMaskType

VOCAB = 32          # content tokens 0..VOCAB-1; VOCAB itself is SEP
D_MODEL = 64
HEADS = 4
MLP_MULT = 4
EVAL_BATCHES = 8


def make_batch(key, batch: int, half: int):
    """-> inputs, targets int32 [B, 2S]; loss_mask f32 [B, 2S] (1 on the reversed half)."""
    a = jax.random.randint(key, (batch, half), 0, VOCAB)
    sep = jnp.full((batch, 1), VOCAB)
    seq = jnp.concatenate([a, sep, a[:, ::-1]], axis=1)              # [B, 2S+1]
    mask = (jnp.arange(2 * half) >= half).astype(jnp.float32)          # [2S]
    return seq[:, :-1], seq[:, 1:], jnp.broadcast_to(mask, (batch, 2 * half))


def init_params(key, layers: int, seq_len: int):
    """Float32 master weights; output projections scaled down by depth (GPT-2 style)."""
    d, f = D_MODEL, MLP_MULT * D_MODEL
    keys = iter(jax.random.split(key, 3 + 4 * layers))
    normal = lambda shape, std=0.02: std * jax.random.normal(next(keys), shape, jnp.float32)
    out_std = 0.02 / np.sqrt(2 * layers)
    return {
        "tok_emb": normal((VOCAB + 1, d)),                           # [V+1, D]
        "pos_emb": normal((seq_len, d)),                              # [T, D]
        "blocks": [{
            "ln1": {"g": jnp.ones(d), "b": jnp.zeros(d)},
            "w_qkv": normal((d, 3 * d)),                              # [D, 3D]
            "w_o": normal((d, d), out_std),                           # [D, D]
            "ln2": {"g": jnp.ones(d), "b": jnp.zeros(d)},
            "w_up": normal((d, f)), "b_up": jnp.zeros(f),             # [D, F]
            "w_down": normal((f, d), out_std), "b_down": jnp.zeros(d),  # [F, D]
        } for _ in range(layers)],
        "ln_f": {"g": jnp.ones(d), "b": jnp.zeros(d)},
        "w_out": normal((d, VOCAB + 1)),                              # [D, V+1]
    }


def layer_norm(x, p):
    """x [B, T, D] -> [B, T, D]; statistics in float32 whatever x's dtype."""
    x32 = x.astype(jnp.float32)
    mu = x32.mean(-1, keepdims=True)
    var = ((x32 - mu) ** 2).mean(-1, keepdims=True)
    return ((x32 - mu) * jax.lax.rsqrt(var + 1e-5) * p["g"] + p["b"]).astype(x.dtype)


# The sharded run (--mesh): None, or (mesh, context-parallel keyword arguments).
SHARDED = None


def _constrain(x, spec):
    if SHARDED is None:
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(SHARDED[0], spec))


def attention(x, blk):
    """x [B, T, D] -> out [B, T, D], max_logit f32 [H]."""
    B, T, D = x.shape
    qkv = (x @ blk["w_qkv"]).reshape(B, T, 3, HEADS, D // HEADS)      # [B, T, 3, H, Dh]
    q, k, v = (_constrain(qkv[:, :, i], P("dp", "cp", "tp")) for i in range(3))
    cp = {} if SHARDED is None else SHARDED[1]
    out, aux = fusedattn.fused_attn((q, k, v), None, None, None,
                                    attn_mask_type=AttnMaskType.CAUSAL_MASK,
                                    return_max_logit=True, **cp)      # out [B, T, H, Dh]
    return out.reshape(B, T, D) @ blk["w_o"], aux["max_logit"]


def forward(params, tokens, dtype, positions=None):
    """tokens int32 [B, T] -> logits f32 [B, T, V+1], per-layer max_logit f32 [L, H].
    positions: the position of each token (None: 0 .. T-1)."""
    p = jax.tree.map(lambda w: w.astype(dtype), params)  # compute dtype; masters stay f32
    pos = jnp.arange(tokens.shape[1]) if positions is None else positions
    x = _constrain(p["tok_emb"][tokens] + p["pos_emb"][pos], P("dp", "cp"))  # [B, T, D]
    max_logits = []
    for blk in p["blocks"]:
        h, max_logit = attention(layer_norm(x, blk["ln1"]), blk)
        x = x + h
        h = jax.nn.gelu(layer_norm(x, blk["ln2"]) @ blk["w_up"] + blk["b_up"])  # [B, T, F]
        x = x + h @ blk["w_down"] + blk["b_down"]
        max_logits.append(max_logit)
    logits = layer_norm(x, p["ln_f"]) @ p["w_out"]
    return logits.astype(jnp.float32), jnp.stack(max_logits)


def loss_and_metrics(params, batch, dtype):
    """-> scalar loss (mean cross-entropy on the reversed half), (accuracy, max_logit [L, H])."""
    inputs, targets, mask = batch[:3]
    logits, max_logits = forward(params, inputs, dtype, batch[3] if len(batch) > 3 else None)
    logp = jax.nn.log_softmax(logits)                                  # [B, T, V+1]
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]  # [B, T]
    correct = (logits.argmax(-1) == targets).astype(jnp.float32)
    n = mask.sum()
    return (nll * mask).sum() / n, ((correct * mask).sum() / n, max_logits)


def adam_init(params):
    """First and second moments shaped like params, and the step count."""
    zeros = jax.tree.map(jnp.zeros_like, params)
    return {"m": zeros, "v": zeros, "t": jnp.zeros((), jnp.int32)}


def adam_update(params, grads, state, lr, b1=0.9, b2=0.98, eps=1e-8):
    """One Adam step (Kingma & Ba) over matching pytrees; lr is a traced scalar."""
    t = state["t"] + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grads)
    # Bias correction folded into the step size (the paper's cheaper form, end of section 2).
    step = lr * jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    params = jax.tree.map(lambda p, m, v: p - step * m / (jnp.sqrt(v) + eps), params, m, v)
    return params, {"m": m, "v": v, "t": t}


def lr_schedule(step, peak: float, total: int):
    """Linear warmup over the first 5% of steps, then cosine decay to 10% of peak."""
    warmup = max(1, total // 20)
    frac = jnp.clip((step - warmup) / max(1, total - warmup), 0.0, 1.0)
    cosine = 0.1 + 0.9 * 0.5 * (1 + jnp.cos(jnp.pi * frac))
    return peak * jnp.where(step < warmup, (step + 1) / warmup, cosine)


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m fusedattn demo",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=16, help="half length S: sequences are 2S tokens")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--min-acc", type=float, default=0.5,
                    help="held-out accuracy needed for exit code 0")
    ap.add_argument("--mesh", default=None,
                    help="train sharded over a mesh, e.g. dp=2,tp=2,cp=2 (axes dp, tp, cp; "
                         "their product = the devices used)")
    ap.add_argument("--cp-strategy", choices=("ring", "all_gather"), default="ring")
    ap.add_argument("--cpu-devices", type=int, default=None,
                    help="virtual CPU devices (sets XLA_FLAGS before jax starts)")
    return ap.parse_args(argv)


def make_mesh(spec: str):
    """'dp=2,tp=2,cp=2' -> a Mesh over the first devices (axes dp, tp, cp; missing ones 1)."""
    sizes = {"dp": 1, "tp": 1, "cp": 1}
    for part in spec.split(","):
        name, _, n = part.partition("=")
        if name not in sizes or not n.isdigit() or int(n) < 1:
            raise SystemExit(f"--mesh: {part!r}; expected dp=N, tp=N, cp=N")
        sizes[name] = int(n)
    n = sizes["dp"] * sizes["tp"] * sizes["cp"]
    if n > len(jax.devices()):
        raise SystemExit(f"--mesh {spec} needs {n} devices; {len(jax.devices())} here "
                         "(on the CPU: --cpu-devices N)")
    devices = np.array(jax.devices()[:n]).reshape(sizes["dp"], sizes["cp"], sizes["tp"])
    return Mesh(devices, ("dp", "cp", "tp"))


def fmt_heads(max_logit) -> str:
    return "[" + " ".join(f"{x:.1f}" for x in np.asarray(max_logit)) + "]"


def main(argv=None) -> int:
    global SHARDED
    args = parse_args(argv)
    if args.cpu_devices:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={args.cpu_devices}")
    dtype = jnp.dtype(args.dtype)
    cp_size = 1
    if args.mesh:
        mesh = make_mesh(args.mesh)
        cp_size = mesh.shape["cp"]
        cp = {} if cp_size == 1 else dict(context_parallel_axis="cp",
                                          context_parallel_strategy=args.cp_strategy,
                                          context_parallel_causal_load_balanced=True)
        SHARDED = (mesh, cp)
        print(f"mesh {dict(mesh.shape)} on {mesh.devices.size} {jax.devices()[0].platform} "
              f"devices | batch over dp, heads over tp, sequence over cp"
              f"{f' ({args.cp_strategy}, load-balanced)' if cp_size > 1 else ''}")
    reorder = ((lambda x: fusedattn.reorder_causal_load_balancing(
        x, fusedattn.ReorderStrategy.DualChunkSwap, cp_size, 1)) if cp_size > 1 else
        (lambda x: x))
    seq_len = 2 * args.seq
    qkv_shape = jax.ShapeDtypeStruct((args.batch, seq_len, HEADS, D_MODEL // HEADS), dtype)
    backend = fusedattn.get_backend((qkv_shape,) * 3, attn_mask_type=AttnMaskType.CAUSAL_MASK)
    print(f"jax {jax.__version__} | backend {jax.default_backend()} | devices {jax.devices()}")
    print(f"fusedattn {fusedattn.__version__} | attention q/k/v {qkv_shape.shape} {dtype.name} "
          f"causal -> {backend.name} (fused={backend.fused}): {backend.reason}")

    key_init, key_train, key_eval = jax.random.split(jax.random.PRNGKey(args.seed), 3)
    params = init_params(key_init, args.layers, seq_len)
    opt_state = adam_init(params)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    print(f"task: reverse {args.seq} tokens (vocab {VOCAB}, chance {1 / VOCAB:.3f}) | model "
          f"{args.layers} layers, d_model {D_MODEL}, {HEADS} heads, {n_params:,} params | "
          f"batch {args.batch}, {args.steps} steps, lr {args.lr}")

    def sharded_batch(key):
        """A batch, its token sequences in the load-balanced order under cp (the model
        reads each token's position with it)."""
        inputs, targets, mask = make_batch(key, args.batch, args.seq)
        positions = jnp.arange(seq_len)[None]
        return reorder(inputs), reorder(targets), reorder(mask), reorder(positions)[0]

    @jax.jit
    def train_step(params, opt_state, step):
        batch = sharded_batch(jax.random.fold_in(key_train, step))
        (loss, (acc, max_logits)), grads = jax.value_and_grad(
            loss_and_metrics, has_aux=True)(params, batch, dtype)
        params, opt_state = adam_update(params, grads, opt_state,
                                        lr_schedule(step, args.lr, args.steps))
        return params, opt_state, loss, acc, max_logits

    @jax.jit
    def eval_acc(params, i):
        batch = sharded_batch(jax.random.fold_in(key_eval, i))
        return loss_and_metrics(params, batch, dtype)[1][0]

    def held_out_acc(params) -> float:
        return float(np.mean([eval_acc(params, i) for i in range(EVAL_BATCHES)]))

    start = time.perf_counter()
    jax.block_until_ready(train_step(params, opt_state, 0))  # compile
    compiled = time.perf_counter()
    for step in range(args.steps):
        params, opt_state, loss, acc, max_logits = train_step(params, opt_state, step)
        if step % args.log_every == 0 or step == args.steps - 1:
            heads = " ".join(f"L{i} max_logit {fmt_heads(m)}" for i, m in enumerate(max_logits))
            ms = (time.perf_counter() - compiled) / (step + 1) * 1e3
            print(f"step {step:5d} | loss {float(loss):.4f} | acc {float(acc):.3f} | "
                  f"{ms:.1f} ms/step | {heads}", flush=True)
    final_acc = held_out_acc(params)
    wall = time.perf_counter() - start
    ok = final_acc > args.min_acc
    print(f"final held-out accuracy {final_acc:.3f} on {EVAL_BATCHES * args.batch} fresh "
          f"sequences (chance {1 / VOCAB:.3f}) | wall {wall:.1f} s | "
          f"{'PASS' if ok else 'FAIL'} (threshold {args.min_acc})")
    return 0 if ok else 1
