"""Float64 comparisons of opgraph graphs with PyTorch on the CPU (a test utility).

``compare(build, torch_fn, feeds, wrt)`` builds ``y = build(*inputs)`` in a
fresh graph (one input per feed, by name), computes ``y``, the gradients of
``<y, R>`` with respect to ``wrt`` and, with ``double=True``, the gradients of
``sum_i <g_i, V_i>`` with respect to ``wrt`` and to ``R`` itself (the output
gradient), in opgraph (``og.compile`` on the default CPU pipeline, in float64)
and in PyTorch (``torch.autograd.grad`` with ``create_graph=True``), and
asserts they agree. ``R`` and ``V_i`` are standard normal, drawn from
``numpy.random.default_rng(seed)``.

Callers ``pytest.importorskip("torch")`` first; nothing here imports torch at
module level.
"""

from __future__ import annotations

import numpy as np

import opgraph as og


def _close(ours, theirs, what, rtol):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    ours = np.asarray(ours, dtype=np.float64)
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape} != PyTorch's {theirs.shape}"
    scale = max(float(np.abs(theirs).max(initial=0.0)), 1e-300)
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=rtol * scale, err_msg=what)


def compare(build, torch_fn, feeds: dict, wrt, *, double: bool = True, seed: int = 0,
            rtol: float = 1e-10, policy=None, choices=None) -> dict:
    """Assert that opgraph and PyTorch agree in float64 on ``build`` / ``torch_fn``.

    Args:
        build: ``build(*values) -> Value`` (or a tuple whose first entry is
            the differentiated output; the rest are compared as plain values
            to the matching entries of ``torch_fn``'s tuple).
        torch_fn: ``torch_fn(*tensors) -> tensor`` (or a matching tuple).
        feeds: input name -> float64 array, in ``build``'s argument order.
        wrt: names of the inputs to differentiate with respect to.
        double: also compare second derivatives (w.r.t. ``wrt`` and the output
            gradient).
        policy: the lowering policy ``og.compile`` gets (None: the default).
        choices: if given, called with the executable's ``choices`` (node name
            -> implementation) to assert which lowerings ran.

    Returns:
        name -> opgraph's first gradient, for further checks.
    """
    import torch

    rng = np.random.default_rng(seed)
    g = og.Graph()
    values = {n: g.input(n, a.shape, "float64") for n, a in feeds.items()}
    built = build(*values.values())
    y, *others = built if isinstance(built, tuple) else (built,)
    tensors = {n: torch.tensor(a, dtype=torch.float64, requires_grad=n in wrt) for n, a in feeds.items()}
    got = torch_fn(*tensors.values())
    ty, *tothers = got if isinstance(got, tuple) else (got,)

    R = rng.standard_normal(y.shape)
    targets = [values[n] for n in wrt]
    first = og.grad(y, targets)
    outputs = [y, *others, *first]
    tR = torch.tensor(R, requires_grad=True)
    tfirst = torch.autograd.grad(ty, [tensors[n] for n in wrt], tR, create_graph=True, allow_unused=True)
    tfirst = [torch.zeros_like(tensors[n]) if t is None else t for n, t in zip(wrt, tfirst)]
    feeds_go = {y: R}
    if double:
        V = [rng.standard_normal(v.shape) for v in first]
        gy = g.value(g.grad_inputs[y.node])
        second = og.grad(first, [*targets, gy])
        outputs += second
        feeds_go.update(zip(first, V))
        wanted = [tensors[n] for n in wrt] + [tR]
        linked = [(t, v) for t, v in zip(tfirst, V) if t.requires_grad]
        tsecond = (torch.autograd.grad([t for t, _ in linked], wanted, [torch.tensor(v) for _, v in linked],
                                       allow_unused=True) if linked else [None] * len(wanted))
        tsecond = [torch.zeros_like(w) if t is None else t for w, t in zip(wanted, tsecond)]
    run = og.compile(outputs, device="cpu", dtype="float64", policy=policy)
    if choices is not None:
        choices(run.choices)
    res = run(grad_outputs=feeds_go, **feeds)
    _close(res[0], ty, "forward", rtol)
    for i, (o, t) in enumerate(zip(res[1:1 + len(others)], tothers)):
        _close(o, t, f"extra output {i}", rtol)
    res_first = res[1 + len(others):1 + len(others) + len(first)]
    for n, o, t in zip(wrt, res_first, tfirst):
        _close(o, t, f"gradient of {n}", rtol)
    if double:
        for n, o, t in zip([*wrt, "output gradient"], res[1 + len(others) + len(first):], tsecond):
            _close(o, t, f"second derivative, w.r.t. {n}", rtol)
    return dict(zip(wrt, res_first))
