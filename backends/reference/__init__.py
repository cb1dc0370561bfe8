"""The NumPy reference backend: the oracle every other lowering is checked against.

Kernels are plain functions written against an array module ``xp`` (numpy or
cupy), taking ``xp`` first, then the op's input arrays, then the op's fields as
keyword arguments (``fn(ctx.xp, *arrays, **op.params())``), or, where they
read the node's geometry, rule kernels ``(ctx, op, *arrays)`` (pooling). Each
registers itself as its op's ``reference`` rule with a decorator of
``kernel.py`` (``@reference(ops.Relu, inplace=0)``); ``rules.py`` imports
every module of the package:

* ``pool``: max and average pooling, forward and backward;
* ``elementwise``: ReLU, threshold, add, bias add, dropout, zeros;
* ``lrn``: local response normalisation across channels;
* ``linear``: fully connected layer and 2-D matmul;
* ``loss``: softmax, log-softmax, cross-entropy;
* ``tensor``: flatten, reshape, concat, slice, pad.

Exact semantics: ``shared/design/SEMANTICS.md``.
"""
