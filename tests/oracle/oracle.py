"""An independent oracle: the example models written in NumPy from what their model files mean,
not from ppc's code, fed parameters and inputs through safetensors files.

    python oracle.py MODEL PARAMS INPUT OUTPUT [--jax]
    python oracle.py restack PARAMS OUT SEED
    python oracle.py grads MODEL PARAMS INPUT TARGET OUT     (gpt2 or llama; needs JAX)

MODEL is tiny, mlp, transformer, gpt2 or llama; PARAMS holds `layers.L.NAME` tensors (ppc's
naming; a language model's embedding and head as `NAME`), INPUT the tensor `input`
[microbatches, ...] (token ids for a language model, whose output is its logits). The sequential model (every layer in order, on every
microbatch) is written to tensor `output` of OUTPUT, in f32. With --jax the same is computed by
JAX (jax.nn.gelu, jax.nn.softmax), the MLP and the transformer through bench/jax_gpipe.py's SPMD
GPipe loop, the very function `make bench` times.
Dimensions are read from the tensors' shapes.
"""

import json
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        buf = data[a:b]
        if v["dtype"] == "F32":
            x = np.frombuffer(buf, "<f4")
        elif v["dtype"] == "F16":
            x = np.frombuffer(buf, "<f2").astype(np.float32)
        elif v["dtype"] == "BF16":
            x = (np.frombuffer(buf, "<u2").astype(np.uint32) << 16).view(np.float32)
        elif v["dtype"] == "I32":  # token ids
            out[name] = np.frombuffer(buf, "<i4").reshape(v["shape"])
            continue
        else:
            raise SystemExit(f"{path}: tensor {name}: dtype {v['dtype']} not handled")
        out[name] = x.reshape(v["shape"]).astype(np.float32)
    return out


def write_safetensors(path, name, x):
    x = np.ascontiguousarray(x, dtype="<f4")
    header = {name: {"dtype": "F32", "shape": list(x.shape), "data_offsets": [0, x.nbytes]}}
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + x.tobytes())


class NumPy:
    """The ops as NumPy users write them."""

    np = np

    @staticmethod
    def gelu(x):  # the tanh approximation, as in GPT-2 and jax.nn.gelu(approximate=True)
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))

    @staticmethod
    def softmax(x, axis):
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)

    @staticmethod
    def layernorm(x, eps):  # over the last axis, biased variance, no affine part
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        return (x - mean) / np.sqrt(var + eps)


def jax_ops():
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", False)

    class Jax:
        np = jnp

        @staticmethod
        def gelu(x):
            return jax.nn.gelu(x, approximate=True)

        @staticmethod
        def softmax(x, axis):
            return jax.nn.softmax(x, axis=axis)

        @staticmethod
        def layernorm(x, eps):
            mean = x.mean(axis=-1, keepdims=True)
            var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
            return (x - mean) * jax.lax.rsqrt(var + eps)

    return Jax


def tiny(ops, x, p):
    return ops.np.tanh(x @ p["w"])


def mlp(ops, x, p):
    return x + ops.np.maximum(x @ p["w1"] + p["b1"], 0.0) @ p["w2"]


def transformer(ops, x, p, heads):
    xp = ops.np
    b, t, d = x.shape
    dh = d // heads
    h = ops.layernorm(x, 1e-5) * p["ln1_g"] + p["ln1_b"]
    split = lambda y: y.reshape(b, t, heads, dh).transpose(0, 2, 1, 3)  # [b, heads, t, dh]
    q, k, v = split(h @ p["wq"]), split(h @ p["wk"]), split(h @ p["wv"])
    scores = (q @ k.transpose(0, 1, 3, 2)) * xp.float32(0.25)  # the file's 1/sqrt(dh), dh = 16
    causal = xp.tril(xp.ones((t, t), dtype=bool))  # query i sees keys j <= i
    scores = xp.where(causal, scores, xp.float32(-1e9))
    o = ops.softmax(scores, axis=-1) @ v
    x1 = x + o.transpose(0, 2, 1, 3).reshape(b, t, d) @ p["wo"]
    h2 = ops.layernorm(x1, 1e-5) * p["ln2_g"] + p["ln2_b"]
    return x1 + ops.gelu(h2 @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


# The language models: `@embed`, the layers, `@head` on each microbatch of token ids. Their
# parameters outside the layers are the tensors not named `layers.L.NAME`.


def causal_attention(ops, q, k, v):
    """q, k, v [b, heads, t, dh]: scaled scores, query i sees keys j <= i, softmax, mix."""
    xp = ops.np
    t, dh = q.shape[2], q.shape[3]
    scores = (q @ k.transpose(0, 1, 3, 2)) * xp.float32(1.0 / np.sqrt(dh))
    scores = xp.where(xp.tril(xp.ones((t, t), dtype=bool)), scores, xp.float32(-1e9))
    return ops.softmax(scores, axis=-1) @ v


def merge_heads(o):
    b, h, t, dh = o.shape
    return o.transpose(0, 2, 1, 3).reshape(b, t, h * dh)


def gpt2_block(ops, x, p, heads):
    b, t, d = x.shape
    split = lambda y: y.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)
    h = ops.layernorm(x, 1e-5) * p["ln1_g"] + p["ln1_b"]
    qkv = h @ p["wqkv"] + p["bqkv"]
    q, k, v = (split(qkv[..., i * d : (i + 1) * d]) for i in range(3))
    x1 = x + merge_heads(causal_attention(ops, q, k, v)) @ p["wo"] + p["bo"]
    h2 = ops.layernorm(x1, 1e-5) * p["ln2_g"] + p["ln2_b"]
    return x1 + ops.gelu(h2 @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def gpt2(ops, ids, ends, layers, heads=2):
    """examples/gpt2.ppc: token plus learned position embeddings, pre-LN blocks, final
    LayerNorm, logits by the token embedding itself (tied)."""
    x = ends["wte"][ids] + ends["wpe"]
    for p in layers:
        x = gpt2_block(ops, x, p, heads)
    h = ops.layernorm(x, 1e-5) * ends["ln_f_g"] + ends["ln_f_b"]
    return h @ ends["wte"].T


def rms_norm(ops, x, g, eps=1e-5):
    return x / ops.np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * g


def rotary(ops, x):
    """x [b, heads, t, dh]: the pair (x_i, x_{i + dh/2}) turned by pos / 10000^(2i/dh)
    (Hugging Face's rotate-half layout)."""
    xp = ops.np
    t, dh = x.shape[2], x.shape[3]
    half = dh // 2
    inv_freq = np.exp(np.arange(half, dtype=np.float64) * (-2.0 * np.log(10000.0) / dh))
    angle = (np.arange(t, dtype=np.float64)[:, None] * inv_freq[None, :]).astype(np.float32)
    cos, sin = xp.cos(angle), xp.sin(angle)
    x1, x2 = x[..., :half], x[..., half:]
    return xp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def llama_block(ops, x, p, heads, kv_heads):
    xp = ops.np
    b, t, d = x.shape
    dh = d // heads
    split = lambda y, n: y.reshape(b, t, n, dh).transpose(0, 2, 1, 3)
    h = rms_norm(ops, x, p["attention_norm"])
    q = rotary(ops, split(h @ p["wq"], heads))
    k = rotary(ops, split(h @ p["wk"], kv_heads))
    v = split(h @ p["wv"], kv_heads)
    # Query head i reads key/value head i // (heads / kv_heads).
    k, v = (xp.repeat(y, heads // kv_heads, axis=1) for y in (k, v))
    x1 = x + merge_heads(causal_attention(ops, q, k, v)) @ p["wo"]
    h2 = rms_norm(ops, x1, p["ffn_norm"])
    u = h2 @ p["w1"]
    silu = u / (1.0 + xp.exp(-u))
    return x1 + (silu * (h2 @ p["w3"])) @ p["w2"]


def llama(ops, ids, ends, layers, heads=4, kv_heads=2):
    """examples/llama.ppc: token embedding, RMSNorm blocks with rotary grouped-query attention
    and a SwiGLU MLP, final RMSNorm, an output projection of its own."""
    x = ends["tok_embeddings"][ids]
    for p in layers:
        x = llama_block(ops, x, p, heads, kv_heads)
    return rms_norm(ops, x, ends["norm"]) @ ends["output"]


LANGUAGE_MODELS = {"gpt2": gpt2, "llama": llama}

def write_tensors(path, tensors):
    """`tensors` (name → array) as f32 safetensors."""
    header, offset, blobs = {}, 0, []
    for name, x in tensors.items():
        x = np.ascontiguousarray(x, dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(x.shape), "data_offsets": [offset, offset + x.nbytes]}
        offset += x.nbytes
        blobs.append(x.tobytes())
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def grads(model, params_path, input_path, target_path, out_path):
    """One training step of a language model in JAX: the mean cross-entropy of its logits
    against the targets over every token of every microbatch, and its gradient with respect
    to every parameter (jax.value_and_grad), written as `loss` and `grad.NAME`."""
    import jax
    import jax.numpy as jnp

    ops = jax_ops()
    run = LANGUAGE_MODELS[model]
    tensors = {n: jnp.asarray(v) for n, v in read_safetensors(params_path).items()}
    ids = read_safetensors(input_path)["input"]
    targets = jnp.asarray(read_safetensors(target_path)["target"])

    def loss(tensors):
        ends = {n: v for n, v in tensors.items() if not n.startswith("layers.")}
        layers = per_layer({n: v for n, v in tensors.items() if n.startswith("layers.")})
        logits = jnp.stack([run(ops, ids[m], ends, layers) for m in range(ids.shape[0])])
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        return (lse - picked).mean()

    value, g = jax.value_and_grad(loss)(tensors)
    out = {"loss": np.asarray(value)}
    out.update({f"grad.{n}": np.asarray(v) for n, v in g.items()})
    write_tensors(out_path, out)


def per_layer(tensors):
    """Layer l's parameters by name, from `layers.l.NAME` tensors or stacked `NAME` ones."""
    layers = {}
    for name, v in tensors.items():
        if name.startswith("layers."):
            _, l, n = name.split(".", 2)
            layers.setdefault(int(l), {})[n] = v
        else:
            for l in range(v.shape[0]):
                layers.setdefault(l, {})[name] = v[l]
    return [layers[l] for l in sorted(layers)]


def restack(params_path, out_path, seed):
    """New parameters for the same model, as a user's script would write them: one stacked
    f32 tensor `NAME` [layers, ...] per parameter, normal with the scale of the originals."""
    layers = per_layer(read_safetensors(params_path))
    rng = np.random.default_rng(int(seed))
    out = {}
    for name in sorted(layers[0]):
        per = [p[name] for p in layers]
        scale = max(float(np.std(np.stack(per))), 0.05)
        out[name] = (rng.standard_normal((len(per),) + per[0].shape) * scale).astype("<f4")
    header, offset, blobs = {}, 0, []
    for name, x in out.items():
        header[name] = {"dtype": "F32", "shape": list(x.shape), "data_offsets": [offset, offset + x.nbytes]}
        offset += x.nbytes
        blobs.append(x.tobytes())
    h = json.dumps(header).encode()
    with open(out_path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    if sys.argv[1] == "restack":
        restack(*sys.argv[2:5])
        return
    if sys.argv[1] == "grads":
        grads(*sys.argv[2:7])
        return
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    use_jax = "--jax" in sys.argv
    model, params_path, input_path, output_path = args
    if model in LANGUAGE_MODELS:
        tensors = read_safetensors(params_path)
        ends = {n: v for n, v in tensors.items() if not n.startswith("layers.")}
        layers = per_layer({n: v for n, v in tensors.items() if n.startswith("layers.")})
        ids = read_safetensors(input_path)["input"]
        run = LANGUAGE_MODELS[model]
        y = np.stack([run(NumPy, ids[m], ends, layers) for m in range(ids.shape[0])])
        write_safetensors(output_path, "output", y)
        return
    params = per_layer(read_safetensors(params_path))
    x = read_safetensors(input_path)["input"]
    ops = jax_ops() if use_jax else NumPy
    heads = 4  # examples/transformer.ppc: heads = 4, dh = d / heads
    block = {"tiny": tiny, "mlp": mlp, "transformer": lambda o, y, p: transformer(o, y, p, heads)}[model]
    if use_jax and model in ("mlp", "transformer"):
        # The benchmark's own SPMD GPipe loop (bench/jax_gpipe.py) on these very weights,
        # stacked [stages, ...] for the MLP (one layer a stage), [stages, k, ...] for the
        # transformer (examples/transformer.ppc: 4 stages, k = 2; layer s·k + j).
        sys.path.insert(0, __file__.rsplit("/tests/", 1)[0] + "/bench")
        import jax.numpy as jnp
        from jax_gpipe import decoder, gpipe, stage_of

        if model == "mlp":
            stacked = tuple(jnp.stack([p[n] for p in params]) for n in ("w1", "b1", "w2"))
            y = np.asarray(gpipe(stacked, jnp.asarray(x)))
        else:
            names = ("ln1_g", "ln1_b", "wq", "wk", "wv", "wo", "ln2_g", "ln2_b", "w1", "b1", "w2", "b2")
            stages = 4
            k = len(params) // stages
            stacked = tuple(
                jnp.stack([p[n] for p in params]).reshape((stages, k) + params[0][n].shape)
                for n in names
            )
            y = np.asarray(gpipe(stacked, jnp.asarray(x), stage_of(decoder(heads))))
    else:
        y = []
        for m in range(x.shape[0]):
            h = ops.np.asarray(x[m])
            for p in params:
                h = block(ops, h, {k: ops.np.asarray(v) for k, v in p.items()})
            y.append(np.asarray(h))
        y = np.stack(y)
    write_safetensors(output_path, "output", y)


if __name__ == "__main__":
    main()
