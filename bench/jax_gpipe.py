"""JAX's SPMD GPipe forward pass, the peer ppc is measured against.

The same model and shapes as examples/mlp.ppc: the residual MLP block
y = x + relu(x @ W1 + b1) @ W2, vmapped over a stage axis, inside the shifting-buffer loop
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


def gpipe(params, x):
    """x: [M, b, d] -> [M, b, d]; params: stacked [S, ...]."""
    w1, b1, w2 = params
    stages = w1.shape[0]
    padded = jnp.pad(x, [(0, stages - 1), (0, 0), (0, 0)])
    state0 = jnp.zeros((stages,) + x.shape[1:], x.dtype)
    first = (jnp.arange(stages) == 0)[:, None, None]
    stage_fn = jax.vmap(block)

    def step(state, inp):
        stage_in = jnp.where(first, inp[None], state)
        out = stage_fn(stage_in, w1, b1, w2)
        shifted = jnp.pad(out, [(1, 0), (0, 0), (0, 0)])[:stages]
        return shifted, out[-1]

    _, last = jax.lax.scan(step, state0, padded)
    return last[stages - 1 :]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--b", type=int, default=16)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--h", type=int, default=1024)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()

    key = jax.random.PRNGKey(0)
    k1, k2, k3 = jax.random.split(key, 3)
    s, d, h = a.stages, a.d, a.h
    params = (
        jax.random.normal(k1, (s, d, h), jnp.float32) * 0.0625,
        jnp.zeros((s, h), jnp.float32),
        jax.random.normal(k2, (s, h, d), jnp.float32) * 0.03125,
    )
    x = jax.random.normal(k3, (a.microbatches, a.b, d), jnp.float32)

    fwd = jax.jit(gpipe)
    t = time.perf_counter()
    compiled = fwd.lower(params, x).compile()
    jit_s = time.perf_counter() - t
    compiled(params, x).block_until_ready()  # warm-up
    compiled(params, x).block_until_ready()
    times = []
    for _ in range(a.steps):
        t = time.perf_counter()
        compiled(params, x).block_until_ready()
        times.append(time.perf_counter() - t)
    times.sort()
    median = times[len(times) // 2]
    flops = 2 * 2 * a.b * d * h * s * a.microbatches  # two matmuls per layer, S layers, M microbatches
    print(json.dumps({
        "peer": "jax", "jax_version": jax.__version__, "devices": str(jax.devices()),
        "jit_s": jit_s, "median_step_s": median, "min_step_s": times[0],
        "useful_gflops": flops / median / 1e9, "microbatches_per_s": a.microbatches / median,
    }))


if __name__ == "__main__":
    main()
