"""Kernel building blocks that first-party (and third-party) backend plugins share.

A plugin's lowering rules (``fxquant_lowering_kernels``) build modules that take
and return integer tensors. The modules here wrap PyTorch's int8 kernels once,
so each plugin states only what differs (engine, ops, constraints):

    quantized_engine/     the quint8-based torch.ops.quantized kernels, run under a chosen
                          engine (fbgemm, qnnpack) with the deprecation warning kept inside
    boundary.py           the float -> integer step at a lowered model's float boundaries
    integer.py            kernels on the integers themselves (IntegerClamp)
"""
