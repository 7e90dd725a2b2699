"""JAX's SPMD GPipe forward pass, the peer ppc is measured against.

The same models and shapes as examples/mlp.ppc (`--model mlp`: the residual MLP block
y = x + relu(x @ W1 + b1) @ W2), examples/transformer.ppc (`--model transformer`: the
pre-LayerNorm decoder block with causal attention and a GELU MLP, k layers per stage) and
examples/gpt2.ppc (`--model gpt2`: GPT-2's blocks in the loop, its token and position embedding
before it and its final LayerNorm and tied head after it, over all microbatches at once, as
MaxText and Praxis place them), vmapped over a stage axis, inside the shifting-buffer loop
(lax.scan) of Lingvo/Praxis: the state buffer [S, b, d] starts at zeros, the input is padded with
S-1 zero microbatches, a select on the stage index feeds stage 0, and the state shifts by one
stage each iteration. Prints one JSON line with the jit time and the forward step times.
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp


def block(x, w1, b1, w2):
    return x + jnp.maximum(x @ w1 + b1, 0.0) @ w2


def layernorm(x, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps)


def decoder(heads):
    """examples/transformer.ppc's @layer on x [b, t, d]."""

    def layer(x, ln1_g, ln1_b, wq, wk, wv, wo, ln2_g, ln2_b, w1, b1, w2, b2):
        b, t, d = x.shape
        dh = d // heads
        h = layernorm(x) * ln1_g + ln1_b
        split = lambda y: y.reshape(b, t, heads, dh).transpose(0, 2, 1, 3)
        q, k, v = split(h @ wq), split(h @ wk), split(h @ wv)
        s = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / dh**0.5)
        s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e9)
        o = (jax.nn.softmax(s, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
        x1 = x + o @ wo
        h2 = layernorm(x1) * ln2_g + ln2_b
        return x1 + jax.nn.gelu(h2 @ w1 + b1, approximate=True) @ w2 + b2

    return layer


def stage_of(layer):
    """A stage: its k layers in turn, on weights stacked [k, ...]."""

    def stage(x, *ws):
        for j in range(ws[0].shape[0]):  # unrolled: k is small, and XLA fuses across layers
            x = layer(x, *(w[j] for w in ws))
        return x

    return stage


def gpipe(params, x, stage=None, remat=False):
    """x: [M, ...] -> [M, ...]; params: stacked [S, ...] (the MLP) or [S, k, ...] (`stage`).
    `remat`: the gradient recomputes each stage from its input (GPipe's choice, `jax.checkpoint`;
    ppc's `--remat=stage`) instead of keeping the scan's residuals (JAX's default)."""
    stages = params[0].shape[0]
    rest = [(0, 0)] * (x.ndim - 1)
    padded = jnp.pad(x, [(0, stages - 1)] + rest)
    state0 = jnp.zeros((stages,) + x.shape[1:], x.dtype)
    first = (jnp.arange(stages) == 0).reshape((stages,) + (1,) * (x.ndim - 1))
    stage_fn = jax.vmap(jax.checkpoint(stage or block) if remat else (stage or block))

    def step(state, inp):
        stage_in = jnp.where(first, inp[None], state)
        out = stage_fn(stage_in, *params)
        shifted = jnp.pad(out, [(1, 0)] + rest)[:stages]
        return shifted, out[-1]

    _, last = jax.lax.scan(step, state0, padded)
    return last[stages - 1 :]


def transformer_setup(a, key):
    """Weights [S, k, ...] and input [M, b, t, d] of examples/transformer.ppc's shapes."""
    s, k, d = a.stages, a.layers_per_stage, a.heads * a.dh
    f = 4 * d
    keys = jax.random.split(key, 8)
    n = lambda i, shape, std: jax.random.normal(keys[i], (s, k) + shape, jnp.float32) * std
    ones, zeros = (lambda shape: jnp.ones((s, k) + shape)), (lambda shape: jnp.zeros((s, k) + shape))
    params = (ones((d,)), zeros((d,)), n(0, (d, d), 0.125), n(1, (d, d), 0.125), n(2, (d, d), 0.125),
              n(3, (d, d), 0.0625), ones((d,)), zeros((d,)), n(4, (d, f), 0.125), zeros((f,)),
              n(5, (f, d), 0.03125), zeros((d,)))
    x = jax.random.normal(keys[6], (a.microbatches, a.b, a.t, d), jnp.float32)
    t, L = a.t, s * k
    # Per layer and microbatch: 4 d×d projections, the scores and values, the MLP's two.
    flops = L * a.microbatches * 2 * a.b * (4 * t * d * d + 2 * t * t * d + 2 * t * d * f)
    return params, x, flops


def gpt2_block(heads):
    """examples/gpt2.ppc's @layer on x [b, t, d]: fused QKV projection, biases everywhere."""

    def layer(x, ln1_g, ln1_b, wqkv, bqkv, wo, bo, ln2_g, ln2_b, w1, b1, w2, b2):
        b, t, d = x.shape
        split = lambda y: y.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)
        h = layernorm(x) * ln1_g + ln1_b
        qkv = h @ wqkv + bqkv
        q, k, v = (split(qkv[..., i * d : (i + 1) * d]) for i in range(3))
        s = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / (d // heads) ** 0.5)
        s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e9)
        o = (jax.nn.softmax(s, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
        x1 = x + o @ wo + bo
        h2 = layernorm(x1) * ln2_g + ln2_b
        return x1 + jax.nn.gelu(h2 @ w1 + b1, approximate=True) @ w2 + b2

    return layer


def gpt2_setup(a, key):
    """examples/gpt2.ppc: ((embedding, position, final norm), stacked layers [S, k, ...]), token
    ids [M, b, t] and next-token targets, and the forward FLOPs as ppc's report counts them."""
    s, k, d, t, vocab = a.stages, a.layers_per_stage, a.heads * a.dh, a.t, a.vocab
    f, layers = 4 * d, s * k
    keys = jax.random.split(key, 8)
    n = lambda i, shape, std: jax.random.normal(keys[i], (s, k) + shape, jnp.float32) * std
    ones, zeros = (lambda shape: jnp.ones((s, k) + shape)), (lambda shape: jnp.zeros((s, k) + shape))
    small = 0.02 / (2 * layers) ** 0.5
    stacked = (ones((d,)), zeros((d,)), n(0, (d, 3 * d), 0.02), zeros((3 * d,)), n(1, (d, d), small),
               zeros((d,)), ones((d,)), zeros((d,)), n(2, (d, f), 0.02), zeros((f,)),
               n(3, (f, d), small), zeros((d,)))
    ends = (jax.random.normal(keys[4], (vocab, d)) * 0.02, jax.random.normal(keys[5], (t, d)) * 0.01,
            jnp.ones((d,)), jnp.zeros((d,)))
    ids = jax.random.randint(keys[6], (a.microbatches, a.b, t), 0, vocab)
    targets = jax.random.randint(keys[7], (a.microbatches, a.b, t), 0, vocab)
    per_layer = 2 * a.b * (3 * t * d * d + t * d * d + 2 * t * t * d + 2 * t * d * f)
    flops = a.microbatches * (layers * per_layer + 2 * a.b * t * d * vocab)
    return (ends, stacked), ids, targets, flops


def gpt2_forward(heads, remat):
    """Token ids [M, b, t] -> logits [M, b, t, vocab]: the embedding on every microbatch, the
    pipelined layers, then the final norm and the tied head on every microbatch."""
    stage = stage_of(gpt2_block(heads))

    def forward(params, ids):
        (wte, wpe, ln_f_g, ln_f_b), stacked = params
        x = gpipe(stacked, wte[ids] + wpe, stage, remat)
        return (layernorm(x) * ln_f_g + ln_f_b) @ wte.T

    return forward


def cross_entropy(logits, targets):
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def adamw_init(params):
    zeros = jax.tree.map(jnp.zeros_like, params)
    return (zeros, zeros, jnp.zeros((), jnp.int32))


def train_step(fwd, loss_of, decays, wd=0.01, warmup=0):
    """One training step as ppc compiles it (`ppc compile --train`): the pipelined forward, the
    loss against targets, its gradient through the pipeline, and AdamW (lr 1e-3, betas
    0.9/0.999, eps 1e-8, weight decay `wd` where `decays`, a tree of bools beside the
    parameters, says: ppc decays matrices, not norm gains and biases; the rate rising linearly
    over `warmup` steps). Arguments: ((params, state, targets), x); returns (loss, params, state)."""
    lr, b1, b2, eps = 1e-3, 0.9, 0.999, 1e-8

    def loss_fn(p, x, target):
        return loss_of(fwd(p, x), target)

    @jax.jit
    def step(carry, x):
        p, (m, v, t), target = carry
        loss, g = jax.value_and_grad(loss_fn)(p, x, target)
        t = t + 1
        rate = lr * jnp.minimum(1.0, t / warmup) if warmup else lr
        m = jax.tree.map(lambda mi, gi: b1 * mi + (1 - b1) * gi, m, g)
        v = jax.tree.map(lambda vi, gi: b2 * vi + (1 - b2) * gi * gi, v, g)
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t

        def update(pi, mi, vi, decay):
            return pi - rate * ((mi / c1) / (jnp.sqrt(vi / c2) + eps) + (wd * pi if decay else 0.0))

        return loss, jax.tree.map(update, p, m, v, decays), (m, v, t)

    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "transformer", "gpt2"], default="mlp")
    ap.add_argument("--b", type=int, default=16, help="microbatch rows (the MLP example: 16; the transformer example: 2)")
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--h", type=int, default=1024)
    ap.add_argument("--t", type=int, default=16)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dh", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=256, help="gpt2: the vocabulary (byte-level: 256)")
    ap.add_argument("--layers-per-stage", type=int, default=2)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20, help="timed steps (0: compile only)")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                    help="storage of weights and activations (bf16: as ppc --dtype bf16; XLA's GPU GEMMs accumulate in f32)")
    ap.add_argument("--train", action="store_true",
                    help="time the training step: value_and_grad of the loss (MSE; gpt2: cross-entropy) against targets, then AdamW")
    ap.add_argument("--remat", choices=["stage", "none"], default="none",
                    help="with --train: `stage` recomputes each stage in the backward (jax.checkpoint), `none` keeps the residuals")
    a = ap.parse_args()

    key = jax.random.PRNGKey(0)
    k1, k2, k3 = jax.random.split(key, 3)
    s, d, h = a.stages, a.d, a.h
    remat = a.train and a.remat == "stage"
    mse = lambda y, target: jnp.mean((y - target) ** 2)
    if a.model == "gpt2":
        params, x, targets, flops = gpt2_setup(a, key)
        fwd, loss_of, wd, warmup = jax.jit(gpt2_forward(a.heads, remat)), cross_entropy, 0.1, 10
        # Matrices: the embeddings [vocab, d] and [t, d], the layers' [S, k, rows, cols].
        decays = (tuple(p.ndim == 2 for p in params[0]), tuple(p.ndim == 4 for p in params[1]))
    else:
        if a.model == "mlp":
            params = (
                jax.random.normal(k1, (s, d, h), jnp.float32) * 0.0625,
                jnp.zeros((s, h), jnp.float32),
                jax.random.normal(k2, (s, h, d), jnp.float32) * 0.03125,
            )
            x = jax.random.normal(k3, (a.microbatches, a.b, d), jnp.float32)
            flops = 2 * 2 * a.b * d * h * s * a.microbatches  # two matmuls per layer, S layers, M microbatches
            stage, matrix_ndim = None, 3
        else:
            params, x, flops = transformer_setup(a, key)
            stage, matrix_ndim = stage_of(decoder(a.heads)), 4
        fwd, loss_of, wd, warmup = jax.jit(lambda p, x: gpipe(p, x, stage, remat)), mse, 0.01, 0
        targets, decays = x * 0.5, tuple(p.ndim == matrix_ndim for p in params)
        if a.dtype == "bf16":
            params, x = tuple(p.astype(jnp.bfloat16) for p in params), x.astype(jnp.bfloat16)
    if a.train:
        fwd = train_step(fwd, loss_of, decays, wd, warmup)
        params, flops = (params, adamw_init(params), targets), 3 * flops
    t = time.perf_counter()
    compiled = fwd.lower(params, x).compile()
    jit_s = time.perf_counter() - t
    mem = compiled.memory_analysis()
    if a.steps == 0:  # the compile alone (bench/compile.sh)
        print(json.dumps({"peer": "jax", "jax_version": jax.__version__, "jit_s": jit_s,
                          "temp_bytes": getattr(mem, "temp_size_in_bytes", None)}))
        return
    jax.block_until_ready(compiled(params, x))  # warm-up
    jax.block_until_ready(compiled(params, x))
    times = []
    for _ in range(a.steps):
        t = time.perf_counter()
        jax.block_until_ready(compiled(params, x))
        times.append(time.perf_counter() - t)
    times.sort()
    median = times[len(times) // 2]
    print(json.dumps({
        "peer": "jax", "jax_version": jax.__version__, "devices": str(jax.devices()),
        "jit_s": jit_s, "median_step_s": median, "min_step_s": times[0],
        "useful_gflops": flops / median / 1e9, "microbatches_per_s": a.microbatches / median,
        "temp_bytes": getattr(mem, "temp_size_in_bytes", None),
    }))


if __name__ == "__main__":
    main()
