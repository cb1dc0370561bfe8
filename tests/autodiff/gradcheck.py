"""Finite-difference checks of ``opgraph.grad`` (a test utility, not library code).

The scalar checked is a random projection of the outputs,
``f = sum_i sum(out_i * R_i)`` with ``R_i ~ N(0, 1)``; ``R_i`` is fed as the
output gradient (``grad_outputs``), so the analytic gradient of ``f`` is what
``grad`` computes. Everything runs on the reference kernels in float64
(``reference_compile``: the ``'reference'`` pipeline, feeds cast to float64).

* Small tensors (at most ``max_elementwise`` elements) are checked element by
  element with central differences ``(f(x + eps e_i) - f(x - eps e_i)) / 2eps``.
* Bigger ones are checked along random directions ``v ~ N(0, 1)``:
  ``<g, v>`` against ``(f(x + eps v) - f(x - eps v)) / 2eps``. For ``v`` of that
  law, ``<g - g_true, v>`` is of the order of ``||g - g_true||``, so an error
  anywhere in ``g`` shows up, while the check costs two evaluations of ``f``.

Central differences have error O(eps^2 f''') + O(u |f| / eps) with u = 2^-52;
at eps = 1e-6 in float64 both are far below the tolerance used (1e-6 relative,
see ``check_grad``). Callers keep inputs away from kinks (ReLU at 0, max-pool
ties) by more than eps (``away_from_zero``, ``distinct``), except where a test
is about a kink; whole models, where that cannot be arranged, use a tiny step
and ``kink_retries``.

Source: the usual gradient check (e.g. ``torch.autograd.gradcheck``; Nocedal &
Wright, "Numerical Optimization", sec. 8.1).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

import opgraph as og
from opgraph.graph import Value


def reference_compile(outputs):
    """``opgraph.compile`` on the oracle: every node on its reference kernel, in float64."""
    return og.compile(outputs, dtype="float64", pipeline="reference")


def _as_list(v) -> list:
    return [v] if isinstance(v, Value) else list(v)


def used_feeds(executable, feeds: Mapping[str, np.ndarray]) -> dict:
    """The feeds ``executable`` reads (it refuses names of sources it does not use)."""
    names = {s.name for s in executable.sources}
    return {k: v for k, v in feeds.items() if k in names}


class Projection:
    """``f(feeds) = sum_i sum(out_i * R_i)`` evaluated by a compiled graph."""

    def __init__(self, outputs: Sequence[Value], projections: Sequence[np.ndarray]):
        self.outputs = list(outputs)
        self.R = [np.asarray(r, dtype=np.float64) for r in projections]
        self.run = reference_compile(self.outputs)

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> float:
        outs = self.run(**used_feeds(self.run, feeds))
        return float(sum(np.sum(np.asarray(o, dtype=np.float64) * r) for o, r in zip(outs, self.R)))


def projections(outputs, seed: int = 0) -> list[np.ndarray]:
    """The ``R_i`` that ``check_grad(outputs, ..., seed=seed)`` uses (drawn first
    from ``numpy.random.default_rng(seed)``)."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(o.shape) for o in _as_list(outputs)]


def analytic_gradients(outputs, wrt, feeds, R, no_grad=()):
    """Add ``grad(outputs, wrt)`` to the graph, run it with the arrays ``R`` as
    the output gradients, return ``(output arrays, gradient arrays)``."""
    outs, targets = _as_list(outputs), _as_list(wrt)
    grads = og.grad(outs, targets, no_grad=no_grad)
    run = reference_compile([*outs, *grads])
    res = run(grad_outputs=dict(zip(outs, R)), **used_feeds(run, feeds))
    return res[:len(outs)], res[len(outs):]


def fd_elementwise(f, feeds, name, eps):
    """Central-difference gradient of ``f`` w.r.t. every element of ``feeds[name]``."""
    x0 = np.array(feeds[name], dtype=np.float64)
    g = np.zeros_like(x0)
    trial = dict(feeds)
    for i in np.ndindex(x0.shape):
        xp, xm = x0.copy(), x0.copy()
        xp[i] += eps
        xm[i] -= eps
        trial[name] = xp
        up = f(trial)
        trial[name] = xm
        down = f(trial)
        g[i] = (up - down) / (2 * eps)
    return g


def fd_directional(f, feeds, name, v, eps: float, f0: float | None = None):
    """Central difference ``(f(x + eps v) - f(x - eps v)) / 2eps`` for ``x = feeds[name]``.

    Returns ``(central, kink)``: ``kink`` is the gap between the one-sided
    slopes ``(f(x + eps v) - f0) / eps`` and ``(f0 - f(x - eps v)) / eps`` when
    ``f0 = f(x)`` is given (else 0). For a function piecewise linear along
    the segment (a ReLU/max-pool net as a function of one weight tensor) it
    is zero up to rounding unless the step crosses a kink.
    """
    x0 = np.asarray(feeds[name], dtype=np.float64)
    trial = dict(feeds)
    trial[name] = x0 + eps * v
    up = f(trial)
    trial[name] = x0 - eps * v
    down = f(trial)
    kink = 0.0 if f0 is None else abs((up - f0) - (f0 - down)) / eps
    return (up - down) / (2 * eps), kink


def check_grad(outputs, wrt, feeds: Mapping[str, np.ndarray], *, seed: int = 0, eps: float = 1e-6,
               rtol: float = 1e-6, atol: float = 1e-9, max_elementwise: int = 96,
               directions: int = 2, no_grad=(), directional_only: bool = False,
               kink_retries: int = 0) -> dict:
    """Check ``opgraph.grad(outputs, wrt)`` against central differences.

    Args:
        outputs: a value or a list of values (any shapes, scalars included).
        wrt: a source value (input, param or grad placeholder) or a list of
            them; each must be fed by name in ``feeds``.
        feeds: source name -> array, for every source of the outputs.
        seed: seeds the projections ``R`` and the directions ``v``.
        eps: finite-difference step.
        rtol, atol: an element passes when ``|g - fd| <= atol + rtol *
            (|fd| + max|fd|)``; a direction passes when ``|<g, v> - fd| <=
            atol + rtol * (|fd| + ||g||)`` (``||g||`` is the typical size of
            ``<g, v>``).
        max_elementwise: tensors up to this many elements are checked element
            by element, bigger ones along ``directions`` random directions.
        no_grad: passed to ``grad``.
        directional_only: never check element by element.
        kink_retries: for directional checks, if the two one-sided slopes
            disagree beyond the tolerance (the step crossed a ReLU or max-pool
            kink), retry with eps / 10, at most this many times. The final
            comparison is always the central difference against ``<g, v>``.

    Returns:
        name -> analytic gradient array (for further exact checks).

    Raises:
        AssertionError: a shape, or a value out of tolerance (the message
            names the input and the worst element or the direction).
    """
    outs, targets = _as_list(outputs), _as_list(wrt)
    rng = np.random.default_rng(seed)
    R = [rng.standard_normal(o.shape) for o in outs]  # as ``projections``
    out_vals, grads = analytic_gradients(outs, targets, feeds, R, no_grad=no_grad)
    f0 = float(sum(np.sum(np.asarray(o, dtype=np.float64) * r) for o, r in zip(out_vals, R)))
    f = Projection(outs, R)
    result = {}
    for target, g in zip(targets, grads):
        name = target.name
        g = np.asarray(g, dtype=np.float64)
        assert g.shape == target.shape, f"gradient of {name}: shape {g.shape} != {target.shape}"
        assert np.all(np.isfinite(g)), f"gradient of {name} is not finite"
        result[name] = g
    for name, g in result.items():
        if g.size == 0:
            continue
        if g.size <= max_elementwise and not directional_only:
            _check_elementwise(f, feeds, name, g, eps, rtol, atol)
        else:
            for k in range(directions):
                v = rng.standard_normal(g.shape)
                _check_direction(f, feeds, name, g, v, f"direction {k}", eps, rtol, atol, f0,
                                 kink_retries)
    return result


def _check_elementwise(f, feeds, name, g, eps, rtol, atol):
    fd = fd_elementwise(f, feeds, name, eps)
    err = np.abs(g - fd)
    bound = atol + rtol * (np.abs(fd) + np.abs(fd).max())
    if np.any(err > bound):
        i = tuple(int(k) for k in np.unravel_index(np.argmax(err - bound), g.shape))
        detail = f"\nanalytic:\n{g}\nfinite differences:\n{fd}" if g.size <= 36 else ""
        raise AssertionError(
            f"gradient of {name} at {i}: analytic {float(g[i])!r}, finite difference "
            f"{float(fd[i])!r} ({int(np.sum(err > bound))} of {g.size} elements off){detail}")


def _check_direction(f, feeds, name, g, v, label, eps, rtol, atol, f0, kink_retries):
    gnorm = float(np.linalg.norm(g))
    an = float(np.sum(g * v))
    for _ in range(kink_retries + 1):
        fd, kink = fd_directional(f, feeds, name, v, eps, f0 if kink_retries else None)
        tol = atol + rtol * (abs(fd) + gnorm)
        if kink <= tol:
            break
        eps /= 10
    if not abs(an - fd) <= tol:
        raise AssertionError(
            f"gradient of {name}, {label}: <g, v> = {an!r}, finite difference {fd!r} "
            f"(|g| = {gnorm:.3e}, difference {abs(an - fd):.3e}, eps {eps:g}, one-sided "
            f"slopes differ by {kink:.3e})")


def run(outputs, feeds, grad_outputs=None) -> list:
    """Compile ``outputs`` in float64 and run them once (for exact checks)."""
    f = reference_compile(_as_list(outputs))
    return f(grad_outputs=grad_outputs, **used_feeds(f, feeds))


def away_from_zero(rng, shape, margin: float = 0.1) -> np.ndarray:
    """Random values of random sign with ``|x| >= margin`` (no ReLU kink within eps)."""
    mag = margin + rng.random(shape)
    return np.where(rng.random(shape) < 0.5, -mag, mag)


def distinct(rng, shape, spacing: float = 0.01) -> np.ndarray:
    """Random values, pairwise at least ``spacing`` apart (no max-pool ties within eps)."""
    n = int(np.prod(shape))
    vals = (rng.permutation(n) - n / 2) * spacing
    return vals.reshape(shape)
