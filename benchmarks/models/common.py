"""What every benchmark model shares: the :class:`Model` record and a small
builder that creates named weights and biases next to each layer.

Naming rule: a layer's node carries the layer's name from its spec: for the
winners ``benchmarks/specs/imagenet_winners.json`` (``'conv1'``,
``'inception_3a/1x1'``), for the modern convnets torchvision's module path
(``'layer1.0.conv2'``, ``benchmarks/specs/modern_convnets.json``). Its
parameters are ``'<layer>.weight'`` (OIHW for convolutions, (out, in) for
linear layers) and ``'<layer>.bias'``, a batch norm's running statistics
the buffers ``'<layer>.running_mean'`` and ``'<layer>.running_var'``: the
keys of torchvision's ``state_dict``, so its weights feed a modern model by
name. The image input is ``'data'``.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import numpy as np

import opgraph as og
from opgraph.errors import ParameterError
from opgraph.graph import Graph, Value
from opgraph.types import numpy_dtype


@attrs.define(eq=False)
class Model:
    """A benchmark model built in the DSL.

    Attributes:
        key: registry name (``'alexnet'``, ``'overfeat'``, ``'vgg_a'``,
            ``'googlenet'``, ``'L1'``..``'L5'``).
        spec_key: its entry in the spec files (``'overfeat_fast'``,
            ``'googlenet_v1'``, ``'L1'``, ...).
        title: human-readable name.
        graph: the graph holding every node.
        input: the image input value, (N, C, H, W).
        output: the model output (logits (N, 1000), or the conv output of a
            layer-suite entry).
        params: every parameter value, in layer order (weight before bias).
        first_conv_input: the input of the first convolution. The seed's
            benchmark computes no gradient with respect to it (Torch
            ``features:get(1).gradInput = nil``), so backward timing asks
            ``grad`` for the parameters only when this is the image.
        seed_batch: the mini-batch size of the seed benchmark (128 or 64).
        batch: the batch this graph was built for.
        dtype: the dtype of every input and parameter.
        state_updates: buffer name -> its new value after this step: the
            running statistics of every training-form batch norm (momentum
            update with the unbiased batch variance), which a training step
            computes as PyTorch's ``BatchNorm2d.train()`` does. Empty for
            models without state.
    """

    key: str
    spec_key: str
    title: str
    graph: Graph
    input: Value
    output: Value
    params: list[Value]
    first_conv_input: Value
    seed_batch: int
    batch: int
    dtype: str
    state_updates: dict[str, Value] = attrs.field(factory=dict)

    @property
    def forward_outputs(self) -> list[Value]:
        """What one forward step computes: the output, then the state updates."""
        return [self.output, *self.state_updates.values()]

    @property
    def param_count(self) -> int:
        """Parameter elements of the whole model."""
        return sum(p.type.size for p in self.params)


class ModelBuilder:
    """Creates the graph, its input and named parameters for one model.

    Each layer method adds one node named ``name`` (plus its parameter
    sources) and returns its output value.
    """

    def __init__(self, key: str, spec_key: str, title: str, *, input_chw: Sequence[int],
                 batch: int | None, seed_batch: int, dtype: str = "float32"):
        if batch is None:
            batch = seed_batch
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
            raise ParameterError("batch", batch, "must be an int >= 0")
        self.key, self.spec_key, self.title = key, spec_key, title
        self.batch, self.seed_batch, self.dtype = batch, seed_batch, dtype
        self.graph = Graph(key)
        self.input = self.graph.input("data", (batch, *input_chw), dtype)
        self.params: list[Value] = []
        self.state_updates: dict[str, Value] = {}
        self.first_conv_input: Value | None = None

    @classmethod
    def torchvision(cls, key: str, title: str, *, image: int, batch: int | None, seed_batch: int,
                    dtype: str) -> "ModelBuilder":
        """The builder of torchvision's ``key`` (its registry and spec key) on a
        (batch, 3, image, image) input. Its models pool globally before their
        classifier, so any ``image`` the strides leave at least 1x1 works
        (32 or more for the modern four); torchvision's is 224.

        Raises:
            ParameterError: ``batch`` is not an int >= 0 (a too small ``image``
                is a ShapeError at the layer it empties).
        """
        return cls(key, key, title, input_chw=(3, image, image), batch=batch,
                   seed_batch=seed_batch, dtype=dtype)

    def _param(self, name: str, shape: Sequence[int]) -> Value:
        p = self.graph.param(name, tuple(shape), self.dtype)
        self.params.append(p)
        return p

    def conv(self, x: Value, name: str, out_channels: int, kernel: int, *,
             stride: int = 1, pad: int = 0, bias: bool = True, groups: int = 1) -> Value:
        """Square ``kernel`` x ``kernel`` convolution with bias, like Torch's
        ``SpatialConvolution(in, out, k, k, s, s, pad, pad)``; ``groups``
        as ``torch.nn.Conv2d`` (``groups == in_channels``: depthwise)."""
        in_channels = x.type.shape[1]
        w = self._param(f"{name}.weight", (out_channels, in_channels // groups, kernel, kernel))
        b = self._param(f"{name}.bias", (out_channels,)) if bias else None
        if self.first_conv_input is None:
            self.first_conv_input = x
        return og.conv2d(x, w, b, stride=stride, padding=pad, groups=groups, name=name)

    def batch_norm(self, x: Value, name: str, *, eps: float = 1e-5, momentum: float = 0.1) -> Value:
        """``torch.nn.BatchNorm2d(C)`` in training mode: batch statistics, affine
        ``weight`` and ``bias`` parameters, and the running statistics as
        buffers (mean 0, variance 1 at first) whose new values go to
        :attr:`Model.state_updates` (``og.batch_norm(..., training=True,
        return_running_stats=True)``; nodes ``name``, ``name/stats``,
        ``name/running_mean``, ``name/running_var``)."""
        c = x.type.shape[1]
        weight, bias = self._param(f"{name}.weight", (c,)), self._param(f"{name}.bias", (c,))
        mean = self.graph.buffer(f"{name}.running_mean", (c,), self.dtype, value=0.0)
        var = self.graph.buffer(f"{name}.running_var", (c,), self.dtype, value=1.0)
        y, self.state_updates[mean.name], self.state_updates[var.name] = og.batch_norm(
            x, mean, var, weight, bias, training=True, momentum=momentum, eps=eps,
            return_running_stats=True, name=name)
        return y

    def conv_norm_activation(self, x: Value, name: str, out_channels: int, kernel: int, *,
                             stride: int = 1, groups: int = 1, activation=None) -> Value:
        """``torchvision.ops.Conv2dNormActivation``: a convolution without bias
        and padding ``(kernel - 1) // 2`` (``name.0``), a batch norm
        (``name.1``) and ``activation`` (a builder such as ``og.relu6`` or
        ``og.silu``, node ``name.2``; None: none)."""
        y = self.conv(x, f"{name}.0", out_channels, kernel, stride=stride, pad=(kernel - 1) // 2,
                      bias=False, groups=groups)
        y = self.batch_norm(y, f"{name}.1")
        return y if activation is None else activation(y, name=f"{name}.2")

    def dropout(self, x: Value, name: str, p: float, seed: int) -> Value:
        """``torch.nn.Dropout(p)`` in training mode: the ``Dropout`` op, whose
        mask is drawn from ``seed`` on every run, so every step drops the same
        cells (PyTorch draws a new mask each step; the work is the same)."""
        return og.dropout(x, p, training=True, seed=seed, name=name)

    def stochastic_depth(self, x: Value, name: str, p: float, seed: int) -> Value:
        """``torchvision.ops.StochasticDepth(p, 'row')`` in training mode: each
        sample's residual branch is kept with probability ``1 - p`` and scaled
        by ``1 / (1 - p)`` (Huang et al. 2016, "Deep Networks with Stochastic
        Depth"). The per-sample mask is drawn here, once, as the ``Dropout``
        op draws its mask (``numpy.random.default_rng(seed).random((N, 1, 1, 1))
        >= p``), and kept as a ``Constant`` (node ``name/mask``) that the
        ``Mul`` node ``name`` applies: the multiply torchvision does every step,
        with a fixed rather than a fresh mask, so every run is reproducible
        and checkable against the float64 reference. ``p == 0`` returns x
        (torchvision's identity).

        Raises:
            ParameterError: ``p`` outside [0, 1).
        """
        if not 0 <= p < 1:
            raise ParameterError("p", p, "the drop probability must be in [0, 1)", name)
        if p == 0:
            return x
        shape = (x.type.shape[0],) + (1,) * (x.type.ndim - 1)
        keep = np.random.default_rng(seed).random(shape) >= p
        mask = (keep / (1.0 - p)).astype(numpy_dtype(self.dtype))
        mask_node = self.graph.apply(og.ops.Constant, {"value": mask}, [], f"{name}/mask")
        return og.mul(x, mask_node, name=name)

    def conv_relu(self, x: Value, conv_name: str, relu_name: str, out_channels: int,
                  kernel: int, *, stride: int = 1, pad: int = 0) -> Value:
        """Convolution then ReLU (the seed's ReLU is in place; ours is a node)."""
        y = self.conv(x, conv_name, out_channels, kernel, stride=stride, pad=pad)
        return og.relu(y, name=relu_name)

    def linear(self, x: Value, name: str, out_features: int, *, bias: bool = True) -> Value:
        """``y = x @ w.T + b`` with w (out_features, in_features)."""
        in_features = x.type.shape[1]
        w = self._param(f"{name}.weight", (out_features, in_features))
        b = self._param(f"{name}.bias", (out_features,)) if bias else None
        return og.linear(x, w, b, name=name)

    def max_pool(self, x: Value, name: str, kernel: int, stride: int, pad: int = 0) -> Value:
        """Floor-mode max pooling (the seed never uses ceil mode)."""
        return og.max_pool2d(x, kernel, stride=stride, padding=pad, ceil_mode=False, name=name)

    def avg_pool(self, x: Value, name: str, kernel: int, stride: int, pad: int = 0) -> Value:
        return og.avg_pool2d(x, kernel, stride=stride, padding=pad, ceil_mode=False,
                             count_include_pad=True, name=name)

    def classifier(self, x: Value, hidden: Sequence[int], classes: int = 1000) -> Value:
        """The AlexNet-style head of the seed: flatten, then fc6 and fc7 each
        followed by ``nn.Threshold(0, 1e-6)`` (thresh6, thresh7), then fc8.
        Dropout is commented out in the seed, so it is absent here."""
        y = og.flatten(x, 1, name="flatten")
        for i, width in enumerate(hidden, start=6):
            y = self.linear(y, f"fc{i}", width)
            y = og.threshold(y, 0.0, 1e-6, name=f"thresh{i}")
        return self.linear(y, f"fc{6 + len(hidden)}", classes)

    def finish(self, output: Value) -> Model:
        """Close the model with ``output`` as its result."""
        return Model(
            key=self.key, spec_key=self.spec_key, title=self.title, graph=self.graph,
            input=self.input, output=output, params=list(self.params),
            first_conv_input=self.first_conv_input or self.input,
            seed_batch=self.seed_batch, batch=self.batch, dtype=self.dtype,
            state_updates=dict(self.state_updates))
