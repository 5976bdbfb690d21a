"""python -m fusedattn demo: a character-level GPT of fusedattn.flax modules on Python's docs.

The text is the documentation that ships with Python (pydoc_data.topics).

The model is flax.linen: token embedding, blocks of fusedattn.flax.linen.MultiHeadAttention
(causal, rotary position embeddings, the per-head max logit recorded) and an MLP, tied
output embedding. It prints a progress bar with the loss, tokens/s and each layer's
per-head max_logit (fused_attn's return_max_logit, the statistic QK-clip watches), then
the step time of the same model (same parameters) with jax.nn.dot_product_attention in
place of fusedattn, writes a PNG of the loss and max_logit curves into --out (matplotlib,
if installed) and samples text with the modules' KV cache. Exit code 0 when the held-out
loss ends below --max-val-loss (default: 3/4 of the uniform guess's, ln(vocab)), so the
demo doubles as an end-to-end check. Defaults take about a minute on 2 CPU cores; on a
GPU the model, batch and step count are larger.

--mesh dp=2,tp=2,cp=2 trains the same model sharded over a device mesh (on the CPU:
--cpu-devices 8 makes 8 virtual devices) by the modules' logical axis names: the batch
over dp, the heads (and the MLP) over tp, the sequence over cp (context parallelism in
every attention layer, --cp-strategy ring or all_gather, load-balanced: the tokens are
reordered in dual chunks once and the model reads their positions with them).
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np

# The model and its modules are built after --cpu-devices has set XLA_FLAGS (main()).
jax = jnp = nn = optax = None

RULES = (("batch", "dp"), ("length", "cp"), ("heads", "tp"), ("mlp", "tp"), ("embed", None),
         ("kv", None), ("qkv", None), ("vocab", None))
CPU_DEFAULTS = dict(steps=300, batch=32, seq=64, layers=2, d_model=64, heads=4, lr=3e-3)
GPU_DEFAULTS = dict(steps=400, batch=64, seq=256, layers=6, d_model=384, heads=6, lr=1e-3)


def load_text() -> str:
    """Python's own documentation topics (pydoc_data.topics), in a fixed order."""
    from pydoc_data.topics import topics
    return "\n\n".join(topics[k] for k in sorted(topics))


def _import_jax():
    global jax, jnp, nn, optax
    import flax.linen as _nn
    import jax as _jax
    import jax.numpy as _jnp
    import optax as _optax
    jax, jnp, nn, optax = _jax, _jnp, _nn, _optax


def build_model_classes():
    """The GPT's linen classes (defined once jax and flax are imported)."""
    from .flax import _common
    from .flax import linen as fl

    class JaxAttention(nn.Module):
        """MultiHeadAttention's math and parameter names ('qkv' [E, 3, H, D], 'out'
        [H, D, E]) with jax.nn.dot_product_attention inside: the timing baseline."""
        num_attention_heads: int
        dtype: object = None

        @nn.compact
        def __call__(self, x, positions):
            E, H = x.shape[-1], self.num_attention_heads
            dt = self.dtype or x.dtype
            init = nn.initializers.lecun_normal()
            w = self.param("qkv", lambda k, s: init(k, (E, 3 * E)).reshape(s), (E, 3, H, E // H))
            qkv = jnp.einsum("bse,ethd->bsthd", x.astype(dt), w.astype(dt))
            q = _common.rotary(qkv[:, :, 0], positions)
            k = _common.rotary(qkv[:, :, 1], positions)
            o = jax.nn.dot_product_attention(q, k, qkv[:, :, 2], is_causal=True)
            w_out = self.param("out", lambda k, s: init(k, (E, E)).reshape(s), (H, E // H, E))
            return jnp.einsum("bshd,hde->bse", o, w_out.astype(dt))

    class Block(nn.Module):
        heads: int
        attention: str = "fusedattn"   # or "jax"
        decode: bool = False
        cp: tuple = ()                 # context-parallel keywords, as (name, value) pairs
        dtype: object = None           # the compute dtype (parameters stay float32)

        @nn.compact
        def __call__(self, x, positions):
            h = nn.LayerNorm(dtype=self.dtype, name="ln1")(x)
            if self.attention == "jax":
                h = JaxAttention(self.heads, self.dtype, name="attn")(h, positions)
            else:
                h = fl.MultiHeadAttention(num_attention_heads=self.heads, attn_mask_type="causal",
                                          enable_rotary_pos_emb=True, record_max_logit=True,
                                          decode=self.decode, dtype=self.dtype, name="attn",
                                          **dict(self.cp))(h, positions=positions)
            x = x + h
            E = x.shape[-1]
            init = nn.initializers.lecun_normal()
            h = nn.Dense(4 * E, kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")),
                         dtype=self.dtype, name="up")(nn.LayerNorm(dtype=self.dtype, name="ln2")(x))
            h = nn.Dense(E, kernel_init=nn.with_logical_partitioning(init, ("mlp", "embed")),
                         dtype=self.dtype, name="down")(nn.gelu(h))
            return nn.with_logical_constraint(x + h, ("batch", "length", "embed"))

    class GPT(nn.Module):
        """tokens int32 [B, T], positions int32 [T] (None: 0 .. T-1; decoding: the cache's)
        -> logits f32 [B, T, V]."""
        vocab: int
        layers: int
        d_model: int
        heads: int
        attention: str = "fusedattn"
        decode: bool = False
        cp: tuple = ()
        dtype: object = None

        @nn.compact
        def __call__(self, tokens, positions=None):
            init = nn.with_logical_partitioning(nn.initializers.normal(0.02), ("vocab", "embed"))
            embed = nn.Embed(self.vocab, self.d_model, dtype=self.dtype, embedding_init=init,
                             name="embed")
            x = nn.with_logical_constraint(embed(tokens), ("batch", "length", "embed"))
            if positions is None and not self.decode:
                positions = jnp.arange(tokens.shape[1])
            for i in range(self.layers):
                x = Block(self.heads, self.attention, self.decode, self.cp, self.dtype,
                          name=f"block_{i}")(x, positions)
            return embed.attend(nn.LayerNorm(dtype=self.dtype, name="ln_f")(x)).astype(
                jnp.float32)

    return GPT


def max_logits(intermediates, layers: int):
    """The sown per-head max logits -> f32 [L, H]."""
    return jnp.stack([intermediates[f"block_{i}"]["attn"]["attention"]["max_logit"][0]
                      for i in range(layers)])


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="python -m fusedattn demo", description=__doc__.split("\n")[0],
        epilog="Unset sizes take the CPU defaults " + _fmt(CPU_DEFAULTS) + ", on a GPU " +
        _fmt(GPU_DEFAULTS) + ".")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq", type=int, default=None, help="context length in characters")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--d-model", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None, help="peak learning rate")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                    help="compute dtype (parameters stay float32); default float32 on the CPU, "
                         "bfloat16 on a GPU")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=50, help="steps between kept log lines")
    ap.add_argument("--compare-steps", type=int, default=10,
                    help="steps timed for the jax.nn.dot_product_attention comparison (0: none)")
    ap.add_argument("--sample-chars", type=int, default=None,
                    help="characters to sample at the end (default: fill the context)")
    ap.add_argument("--prompt", default="The ")
    ap.add_argument("--out", default="demo_out", help="directory for the PNG")
    ap.add_argument("--max-val-loss", type=float, default=None,
                    help="held-out loss needed for exit code 0 (default 0.75 ln(vocab))")
    ap.add_argument("--mesh", default=None,
                    help="train sharded over a mesh, e.g. dp=2,tp=2,cp=2 (axes dp, tp, cp; "
                         "their product = the devices used)")
    ap.add_argument("--cp-strategy", choices=("ring", "all_gather"), default="ring")
    ap.add_argument("--cpu-devices", type=int, default=None,
                    help="virtual CPU devices (sets XLA_FLAGS before jax starts)")
    return ap.parse_args(argv)


def _fmt(d: dict) -> str:
    return "(" + ", ".join(f"{k} {v}" for k, v in d.items()) + ")"


def make_mesh(spec: str):
    """'dp=2,tp=2,cp=2' -> a Mesh over the first devices (axes dp, cp, tp; missing ones 1)."""
    from jax.sharding import Mesh
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


def fmt_heads(m) -> str:
    return "[" + " ".join(f"{x:.1f}" for x in np.asarray(m)) + "]"


def bar(done: int, total: int, width: int = 24) -> str:
    filled = int(width * done / max(total, 1))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def plot(path, losses, val, logits):
    """Loss (train per step, held-out at log points) and each layer's per-head max_logit."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no PNG (pip install matplotlib)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    logits = np.asarray(logits)                                   # [steps, L, H]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(losses, lw=0.8, label="train")
    if val:
        a.plot(*zip(*val), "o-", label="held-out")
    a.set(xlabel="step", ylabel="cross-entropy (nats/char)", title="loss")
    a.legend()
    for layer in range(logits.shape[1]):
        for h in range(logits.shape[2]):
            b.plot(logits[:, layer, h], lw=0.8, color=f"C{layer}",
                   label=f"layer {layer}" if h == 0 else None)
    b.set(xlabel="step", ylabel="max logit", title="per-head max_logit (fused_attn)")
    b.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def sample(GPT, cfg, params, encode, decode, prompt: str, n: int, seq: int, key) -> str:
    """Prompt + n characters from the model, the prompt in one call, then one token a call,
    through the modules' KV cache (seq slots)."""
    model = GPT(**cfg, decode=True)
    ids = jnp.asarray([encode(prompt)], jnp.int32)
    n = min(n, seq - ids.shape[1])
    cache = model.init(jax.random.PRNGKey(0), jnp.zeros((1, seq), jnp.int32))["cache"]
    step = jax.jit(lambda c, t: model.apply({"params": params, "cache": c}, t,
                                            mutable=["cache", "intermediates"]))
    logits, upd = step(cache, ids)
    out = []
    for i in range(n):
        key, sub = jax.random.split(key)
        nxt = jax.random.categorical(sub, logits[0, -1] / 0.8)
        out.append(int(nxt))
        if i + 1 < n:
            logits, upd = step(upd["cache"], nxt.reshape(1, 1).astype(jnp.int32))
    return prompt + decode(out)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.cpu_devices:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={args.cpu_devices}")
    _import_jax()
    import fusedattn

    defaults = GPU_DEFAULTS if jax.default_backend() == "gpu" else CPU_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)

    text = load_text()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    encode = lambda s: [index[c] for c in s if c in index]
    decode = lambda ids: "".join(chars[i] for i in ids)
    data = np.array(encode(text), np.int32)
    split = int(0.9 * len(data))
    train_data, val_data = jnp.asarray(data[:split]), jnp.asarray(data[split:])
    V, T, B = len(chars), args.seq, args.batch
    max_val = args.max_val_loss if args.max_val_loss is not None else 0.75 * math.log(V)

    mesh, cp_size, cp = None, 1, ()
    if args.mesh:
        mesh = make_mesh(args.mesh)
        cp_size = mesh.shape["cp"]
        if cp_size > 1:
            cp = (("context_parallel_axis", "cp"), ("context_parallel_strategy", args.cp_strategy),
                  ("context_parallel_causal_load_balanced", True))
        print(f"mesh {dict(mesh.shape)} on {mesh.devices.size} {jax.devices()[0].platform} "
              f"devices | batch over dp, heads over tp, sequence over cp"
              f"{f' ({args.cp_strategy}, load-balanced)' if cp_size > 1 else ''}")
    reorder = ((lambda x: fusedattn.reorder_causal_load_balancing(
        x, fusedattn.ReorderStrategy.DualChunkSwap, cp_size, 1)) if cp_size > 1 else
        (lambda x: x))

    GPT = build_model_classes()
    if args.dtype is None:
        args.dtype = "bfloat16" if jax.default_backend() == "gpu" else "float32"
    dtype = jnp.dtype(args.dtype)
    cfg = dict(vocab=V, layers=args.layers, d_model=args.d_model, heads=args.heads, dtype=dtype)
    model = GPT(**cfg, cp=cp)
    head_dim = args.d_model // args.heads
    qkv = jax.ShapeDtypeStruct((B, T, args.heads, head_dim), dtype)
    backend = fusedattn.get_backend((qkv,) * 3, attn_mask_type=fusedattn.AttnMaskType.CAUSAL_MASK)
    print(f"jax {jax.__version__} | backend {jax.default_backend()} | {len(jax.devices())} devices"
          f" | fusedattn {fusedattn.__version__}: attention {qkv.shape} causal -> {backend.name}"
          f" ({backend.reason})")

    k_init, k_train, k_val, k_sample = jax.random.split(jax.random.PRNGKey(args.seed), 4)
    boxed = model.init(k_init, jnp.zeros((B, T), jnp.int32))
    params = nn.meta.unbox(boxed)["params"]
    n_params = sum(x.size for x in jax.tree.leaves(params))
    print(f"data: pydoc_data.topics, {len(data):,} characters, vocab {V} (uniform guess "
          f"{math.log(V):.2f} nats) | model: {args.layers} layers, d_model {args.d_model}, "
          f"{args.heads} heads, RoPE, {n_params:,} params, {dtype.name} | batch {B} x {T} chars, "
          f"{args.steps} steps, lr {args.lr}")
    warmup = max(1, args.steps // 20)
    schedule = optax.warmup_cosine_decay_schedule(0.0, args.lr, warmup, max(args.steps, warmup + 1),
                                                  end_value=0.1 * args.lr)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, b2=0.95,
                                                                 weight_decay=0.01))

    def batch_of(source, key):
        """inputs, targets int32 [B, T] (in the load-balanced order under cp), positions [T]."""
        starts = jax.random.randint(key, (B,), 0, source.shape[0] - T - 1)
        window = jax.vmap(lambda s: jax.lax.dynamic_slice(source, (s,), (T + 1,)))(starts)
        return reorder(window[:, :-1]), reorder(window[:, 1:]), reorder(jnp.arange(T)[None])[0]

    def loss_fn(params, batch, m):
        inputs, targets, positions = batch
        inputs = nn.with_logical_constraint(inputs, ("batch", "length"))
        logits, inter = m.apply({"params": params}, inputs, positions, mutable=["intermediates"])
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
        logs = max_logits(inter["intermediates"], args.layers) if m.attention != "jax" else None
        return nll, logs

    def make_step(m):
        @jax.jit
        def train_step(params, opt_state, step):
            batch = batch_of(train_data, jax.random.fold_in(k_train, step))
            (loss, logs), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, m)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss, logs
        return train_step

    @jax.jit
    def val_loss(params, i):
        return loss_fn(params, batch_of(val_data, jax.random.fold_in(k_val, i)), model)[0]

    def held_out(params) -> float:
        return float(np.mean([val_loss(params, i) for i in range(4)]))

    context = None
    if mesh is not None:
        context = (jax.set_mesh(mesh), nn.logical_axis_rules(RULES))
        for c in context:
            c.__enter__()
        shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, RULES)
        params = jax.device_put(params, shardings["params"])
    try:
        train_step = make_step(model)
        opt_state = tx.init(params)
        start = time.perf_counter()
        jax.block_until_ready(train_step(params, opt_state, 0))   # compile
        print(f"compiled the train step in {time.perf_counter() - start:.1f} s")
        losses, logit_hist, val_points = [], [], []
        t0 = time.perf_counter()
        for step in range(args.steps):
            params, opt_state, loss, logs = train_step(params, opt_state, step)
            loss, logs = float(loss), np.asarray(logs)
            losses.append(loss)
            logit_hist.append(logs)
            now = time.perf_counter()
            tok_s = (step + 1) * B * T / (now - t0)
            heads = " ".join(f"L{i} {fmt_heads(m)}" for i, m in enumerate(logs))
            line = (f"\r{bar(step + 1, args.steps)} step {step + 1}/{args.steps} | loss "
                    f"{loss:.4f} | {tok_s / 1e3:.1f}k tok/s | "
                    f"{(now - t0) / (step + 1) * 1e3:.1f} ms/step | max_logit {heads}")
            keep = (step + 1) % args.log_every == 0 or step + 1 == args.steps
            if keep:
                v = held_out(params)
                val_points.append((step, v))
                line += f" | held-out {v:.4f}"
            print(line, end="\n" if keep else "", flush=True)
        final = val_points[-1][1] if val_points else held_out(params)
        train_time = time.perf_counter() - t0
    finally:
        if context is not None:
            for c in reversed(context):
                c.__exit__(None, None, None)

    params = jax.device_get(params)
    print(f"trained {args.steps} steps in {train_time:.1f} s; held-out loss {final:.4f} "
          f"(uniform guess {math.log(V):.2f})")
    if args.compare_steps > 0:
        compare(GPT, cfg, params, tx, make_step, loss_fn, batch_of, train_data, k_train,
                args.compare_steps, B * T, mesh is not None)
    plot(os.path.join(args.out, "demo.png"), losses, val_points, logit_hist)
    text_out = sample(GPT, cfg, params, encode, decode, args.prompt,
                      args.sample_chars or T, T, k_sample)
    print("sample (KV-cache decoding, temperature 0.8):\n" + text_out)
    ok = final < max_val
    print(f"{'PASS' if ok else 'FAIL'}: held-out loss {final:.4f} "
          f"{'<' if ok else '>='} {max_val:.4f}")
    return 0 if ok else 1


def compare(GPT, cfg, params, tx, make_step, loss_fn, batch_of, train_data, key, n, tokens,
            sharded):
    """The same model, same parameters, one device: its train step with fusedattn and with
    jax.nn.dot_product_attention, each timed as the best of 3 alternating rounds of n steps
    after compiling."""
    if sharded:
        print("(the jax.nn.dot_product_attention comparison runs on one device, unsharded)")
    batch = batch_of(train_data, key)
    batch = (batch[0], batch[1], jnp.arange(batch[0].shape[1]))  # natural order
    times, loss, runs = {}, {}, {}
    for name in ("fusedattn", "jax"):
        m = GPT(**cfg, attention=name)
        loss[name] = float(loss_fn(params, batch, m)[0])
        step = make_step(m)
        p, s = params, tx.init(params)
        for i in range(3):  # compile and warm up
            p, s, _, _ = step(p, s, i)
        jax.block_until_ready(p)
        runs[name] = [step, p, s]
        times[name] = float("inf")
    # Alternate rounds of n steps and keep each one's best: a single short window was
    # measured 0.5x-1.5x on the same GPU (dev/autodiff/README.md).
    for _ in range(3):
        for name, run in runs.items():
            step, p, s = run
            t0 = time.perf_counter()
            for i in range(n):
                p, s, _, _ = step(p, s, i)
            jax.block_until_ready(p)
            times[name] = min(times[name], (time.perf_counter() - t0) / n)
            run[1:] = [p, s]
    f, j = times["fusedattn"], times["jax"]
    print(f"same model, same parameters: loss on one batch fusedattn {loss['fusedattn']:.6f} | "
          f"jax.nn.dot_product_attention {loss['jax']:.6f}")
    print(f"train step (best of 3 rounds of {n}): fusedattn {f * 1e3:.1f} ms ({tokens / f / 1e3:.1f}k tok/s) | "
          f"jax.nn.dot_product_attention {j * 1e3:.1f} ms ({tokens / j / 1e3:.1f}k tok/s) | "
          f"fusedattn / jax {f / j:.2f}x")
