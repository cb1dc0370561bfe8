"""Two modern blocks end to end against PyTorch (CPU, float64): a ResNet basic block
with training-form batch norm (conv -> bn -> relu -> conv -> bn -> + x -> relu) and an
EfficientNet squeeze-and-excitation block (global pool -> conv1x1 -> silu -> conv1x1
-> sigmoid -> scale). Weights are ``param`` sources, running statistics ``buffer``
sources; ``og.grad`` with respect to every parameter and the input, compiled on
the default CPU pipeline in float64, against ``torch.autograd``."""

import numpy as np
import pytest

import opgraph as og

torch = pytest.importorskip("torch")
F = torch.nn.functional

N, C, H, W = 2, 4, 5, 5


def _check(ours, theirs, what):
    theirs = theirs.detach().numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-10 * np.abs(theirs).max(), err_msg=what)


def _run(g, y, params, x, extra, feeds, gy):
    grads = og.grad(y, [*params, x])
    run = og.compile([y, *extra, *grads], device="cpu", dtype="float64")
    return run(grad_outputs={y: gy}, **feeds)


def _torch_grads(ty, tensors, gy):
    return torch.autograd.grad(ty, tensors, torch.tensor(gy))


def test_resnet_basic_block_with_training_batch_norm_matches_torch():
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((N, C, H, W)),
             "w1": rng.standard_normal((C, C, 3, 3)) / 6, "w2": rng.standard_normal((C, C, 3, 3)) / 6}
    for i in (1, 2):
        feeds.update({f"g{i}": 1 + 0.3 * rng.standard_normal(C), f"b{i}": 0.3 * rng.standard_normal(C)})
    stats = {"m1": rng.standard_normal(C), "v1": 0.5 + rng.random(C)}
    gy = rng.standard_normal((N, C, H, W))

    g = og.Graph()
    x = g.input("x", (N, C, H, W))
    p = {k: g.param(k, feeds[k].shape) for k in ("w1", "g1", "b1", "w2", "g2", "b2")}
    rm, rv = g.buffer("m1", (C,), value=stats["m1"]), g.buffer("v1", (C,), value=stats["v1"])
    h, new_m, new_v = og.batch_norm(og.conv2d(x, p["w1"], padding=1), rm, rv, p["g1"], p["b1"],
                                    training=True, return_running_stats=True, name="bn1")
    h = og.conv2d(og.relu(h), p["w2"], padding=1)
    y = og.relu(og.add(og.batch_norm(h, None, None, p["g2"], p["b2"], training=True), x))
    ours = _run(g, y, list(p.values()), x, [new_m, new_v], feeds, gy)  # buffers from their defaults

    t = {k: torch.tensor(v, requires_grad=True) for k, v in feeds.items()}
    tm, tv = torch.tensor(stats["m1"]), torch.tensor(stats["v1"])
    th = F.batch_norm(F.conv2d(t["x"], t["w1"], padding=1), tm, tv, t["g1"], t["b1"], training=True)
    th = F.conv2d(F.relu(th), t["w2"], padding=1)
    ty = F.relu(F.batch_norm(th, None, None, t["g2"], t["b2"], training=True) + t["x"])
    theirs = [ty, tm, tv, *_torch_grads(ty, [t[k] for k in (*p, "x")], gy)]
    for what, o, e in zip(["y", "running_mean", "running_var", *p, "x"], ours, theirs):
        _check(o, e, what)


def test_squeeze_and_excitation_block_matches_torch():
    rng = np.random.default_rng(1)
    squeezed = 2
    feeds = {"x": rng.standard_normal((N, C, H, W)),
             "w1": rng.standard_normal((squeezed, C, 1, 1)), "b1": rng.standard_normal(squeezed),
             "w2": rng.standard_normal((C, squeezed, 1, 1)), "b2": rng.standard_normal(C)}
    gy = rng.standard_normal((N, C, H, W))

    g = og.Graph()
    x = g.input("x", (N, C, H, W))
    p = {k: g.param(k, feeds[k].shape) for k in ("w1", "b1", "w2", "b2")}
    s = og.silu(og.conv2d(og.adaptive_avg_pool2d(x, 1), p["w1"], p["b1"]))
    y = og.mul(x, og.sigmoid(og.conv2d(s, p["w2"], p["b2"])))
    ours = _run(g, y, list(p.values()), x, [], feeds, gy)

    t = {k: torch.tensor(v, requires_grad=True) for k, v in feeds.items()}
    ts = F.silu(F.conv2d(F.adaptive_avg_pool2d(t["x"], 1), t["w1"], t["b1"]))
    ty = t["x"] * torch.sigmoid(F.conv2d(ts, t["w2"], t["b2"]))
    theirs = [ty, *_torch_grads(ty, [t[k] for k in (*p, "x")], gy)]
    for what, o, e in zip(["y", *p, "x"], ours, theirs):
        _check(o, e, what)
