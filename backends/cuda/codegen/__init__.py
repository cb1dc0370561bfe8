"""A generator of CUDA kernels for memory-bound ops (the ``codegen`` algorithm).

A chain of element-wise ops over equal or broadcast shapes, with per-channel,
per-plane or total reductions consuming it (one op, or a ``FusedElementwise``
program), becomes one kernel, or one kernel per reduction phase plus an
element-wise one, compiled by NVRTC through CuPy and cached. Modules, in the
order a program goes through them:

* ``expressions``: the table of op types -> IR (their reference formulas in CT;
  ``table``: the table itself;
  ``layer_norm``: layer normalisation's ops);
* ``ir``: the IR builder (spaces: full, plane, channel, scalar, and the rows and
  columns of a split at trailing axes; reductions);
* ``plan``: phases, vector width, index width, launch geometry;
* ``contexts``, ``emit``, ``kernels``: index arithmetic, statements, kernel text;
* ``storage``: loads and stores of each storage dtype, 16 bytes at a time;
* ``launch``: the compile and plan caches and the launch path;
* ``copies``: strided copies (concat, slice, pad, their gradients, layout changes).

``backends/cuda/codegen_rules.py`` registers the ``codegen`` rules.
Importing this package needs neither CuPy nor a GPU.
"""
