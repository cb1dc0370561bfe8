"""Abstract ops, one module per family. Every class is re-exported here."""

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
from .activation import (Hardsigmoid, HardsigmoidBackward, Hardswish, HardswishBackward, Hardtanh,
                         HardtanhBackward)
from .arithmetic import Div, Neg
from .batchnorm_training import (BatchNormRunningUpdate, BatchNormStats, BatchNormTraining,
                                 BatchNormTrainingBackwardData, BatchNormTrainingBackwardScale,
                                 BatchNormTrainingDoubleBackward)
from .layer_norm import LayerNorm, LayerNormBackwardData, LayerNormBackwardScale, LayerNormDoubleBackward
from .reduce import Mean, MeanBackward
from .smooth_activation import Gelu, GeluBackward, Sigmoid, SigmoidBackward, Silu, SiluBackward

__all__ = [name for name in dir() if name[0].isupper()]
