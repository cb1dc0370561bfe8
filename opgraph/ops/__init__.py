"""Abstract ops, one module per family. Every class is re-exported here."""

from .conv import Conv2d, Conv2dBackwardData, Conv2dBackwardFilter
from .elementwise import (Add, BiasAdd, BiasAddBackward, Dropout, Relu, ReluBackward,
                          Threshold, ThresholdBackward, Zeros)
from .linear import Linear, MatMul
from .loss import (CrossEntropy, CrossEntropyBackward, LogSoftmax, LogSoftmaxBackward,
                   Softmax, SoftmaxBackward)
from .lrn import LocalResponseNorm, LocalResponseNormBackward
from .pool import AvgPool2d, AvgPool2dBackward, MaxPool2d, MaxPool2dBackward, MaxPool2dSelect
from .tensor import Concat, Flatten, Pad, PadBackward, Reshape, Slice, SliceBackward

__all__ = [name for name in dir() if name[0].isupper()]
