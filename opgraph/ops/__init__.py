"""Abstract ops, one module per family. Every class is re-exported here;
``__all__`` lists the op classes (the policy's op names)."""

from .broadcast import BroadcastAdd, BroadcastTo, Mul, SumTo
from .conv import Conv2d, Conv2dBackwardData, Conv2dBackwardFilter, Conv2dBiasRelu
from .elementwise import (Add, BiasAdd, BiasAddBackward, Dropout, Relu, ReluBackward,
                          Threshold, ThresholdBackward, Zeros)
from .global_pool import GlobalAvgPool2d, GlobalAvgPool2dBackward
from .linear import Linear, MatMul
from .loss import (CrossEntropy, CrossEntropyBackward, LogSoftmax, LogSoftmaxBackward,
                   Softmax, SoftmaxBackward)
from .lrn import LocalResponseNorm, LocalResponseNormBackward
from .norm import BatchNorm, BatchNormBackwardData, BatchNormBackwardScale
from .pool import (AvgPool2d, AvgPool2dBackward, MaxPool2d, MaxPool2dBackward, MaxPool2dBackwardRelu,
                   MaxPool2dSelect)
from .shape import Constant, Transpose
from .tensor import Concat, Flatten, Pad, PadBackward, Reshape, Slice, SliceBackward

__all__ = [name for name in dir() if name[0].isupper()]


def of_family(family: str, direction: str | None = None) -> tuple[type, ...]:
    """The op classes of ``family`` (and ``direction`` when given), by name:
    the declarations ``Op.family`` / ``Op.direction`` read back, e.g.
    ``of_family('conv', 'wgrad') == (Conv2dBackwardFilter,)``."""
    classes = (globals()[name] for name in sorted(__all__))
    return tuple(c for c in classes if c.family == family and direction in (None, c.direction))

