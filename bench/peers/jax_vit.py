#!/usr/bin/env python3
"""The reference experiment with JAX/Flax: the ViT of flax_vit.py (transformers'
ViTForImageClassification in flax.linen, checked against PyTorch by
check_parity.py; transformers 5 no longer ships a Flax ViT), a flax TrainState
with optax SGD (lr 1e-3), the whole step under jax.jit with the state donated,
random N(0,1) NHWC images, labels i % 1000, mean softmax cross-entropy. A step
is timed only after its loss is ready (block_until_ready)."""
import argparse
import os

import common


def main():
    p = argparse.ArgumentParser(description=__doc__)
    common.add_common_args(p)
    args = p.parse_args()
    if args.threads:
        common.fail("jax_vit: --threads is not supported; XLA:CPU uses every core of the machine")
    if args.device == "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    import jax.numpy as jnp
    import optax
    from flax.training import train_state

    import flax_vit

    if args.device == "cuda":
        if jax.devices()[0].platform != "gpu":
            common.fail(f"jax_vit: --device cuda but JAX runs on {jax.devices()[0].platform} "
                        "(is jax installed with CUDA support?)")
        jax.config.update("jax_default_matmul_precision", "tensorfloat32")  # the reference's tf32
    # bf16: flax's mixed precision (computation in bfloat16, f32 parameters).
    extra = {"dtype": jnp.bfloat16} if args.precision == "bf16" else {}
    shape = common.preset(args.model)
    arch = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "num_labels",
            "patch_size")
    model = flax_vit.ViTForImageClassification(**{k: shape[k] for k in arch}, **extra)
    n = args.batch_size
    init_key, data_key = jax.random.split(jax.random.PRNGKey(args.seed))
    images = jax.random.normal(data_key, (n, shape["image_size"], shape["image_size"], shape["num_channels"]),
                               jnp.float32)  # NHWC
    params = model.init(init_key, images[:1])["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(args.lr))
    labels = jnp.arange(n) % shape["num_labels"]

    def loss_fn(params, images, labels):
        logits = state.apply_fn({"params": params}, images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def step(state, images, labels):
        loss, grads = jax.value_and_grad(loss_fn)(state.params, images, labels)
        return state.apply_gradients(grads=grads), loss

    train_step = jax.jit(step, donate_argnums=(0,))
    times, losses = [], []
    for i in range(args.steps):
        t0 = common.now()
        state, loss = train_step(state, images, labels)
        value = float(loss.block_until_ready())
        times.append(common.now() - t0)
        losses.append(value)
        print(f"step {i + 1}/{args.steps}  loss {value:.4f}  {times[-1]:.3f} s", flush=True)
    gpu = None
    if args.device == "cuda":
        stats = jax.devices()[0].memory_stats() or {}
        gpu = stats.get("peak_bytes_in_use", 0) / 2**20
    common.report("jax jit", args, times, losses, times[0], extra={"jax": jax.__version__}, peak_gpu_mib=gpu)


if __name__ == "__main__":
    main()
