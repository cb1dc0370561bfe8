"""Stand-ins of the cuDNN frontend's graph objects for the CPU tests of our
graphs (test_cudnn_standin.py: convolutions; test_cudnn_norm_standin.py:
batch norm). Each test's graph subclasses :class:`FakeGraphBase` with the
frontend methods it builds, their parameters named as the frontend's."""

from __future__ import annotations


class FakeTensor:
    """A graph tensor: its name and attributes (dim, stride, data type ...)."""

    def __init__(self, graph, name, **attrs):
        self.graph, self.name, self.attrs = graph, name, attrs

    def set_output(self, flag):
        self.graph.outputs.append(self)
        return self

    def set_data_type(self, t):
        self.attrs["data_type"] = t
        return self

    def set_dim(self, d):
        self.attrs["dim"] = d
        return self

    def set_stride(self, s):
        self.attrs["stride"] = s
        return self

    def get_uid(self):
        return id(self)


class FakeGraphBase:
    """Records the calls, the tensors and the outputs; one engine, 64 B of workspace."""

    def __init__(self, **kw):
        self.kw, self.calls, self.tensors, self.outputs = kw, [], [], []

    @property
    def output(self):
        """The last tensor marked an output."""
        return self.outputs[-1]

    def validate(self):
        pass

    def build_operation_graph(self):
        pass

    def deselect_numeric_notes(self, notes):
        pass

    def create_execution_plans(self, modes):
        pass

    def get_execution_plan_count(self):
        return 1

    def build_plan_at_index(self, i):
        pass

    def get_workspace_size_plan_at_index(self, i):
        return 64
