"""The kernels every backend's lowering uses, whatever runs its int8 ops.

A plugin's lowering rules (``fxquant_lowering_kernels``) build modules that take
and return integer tensors. The core keeps only what holds for every backend;
the kernels of one family of backends live with those plugins (oneDNN's in
``fxquant-onednn``, which x86 builds on; the quint8 engines' in
``fxquant-quantized-engine``, which fbgemm and qnnpack build on):

    boundary.py           the float -> integer step at a lowered model's float boundaries
                          (the flow's epilogues put it there)
    cpu.py                whether this CPU's uint8 x int8 kernels (oneDNN's, FBGEMM's) are
                          exact, and for which weights (no VNNI: within +-64)
    integer.py            kernels on the integers themselves (IntegerClamp)
"""
