"""Embedding lookups in the integer table: the rows looked up, then dequantized.

A reference ``Embedding`` (``fxquant.nn.reference``) dequantizes its whole table on every
call, then looks the rows up: a BERT's 30522 x 768 table is 23M floats per forward, more
than the model's int8 linears take. The kernel keeps the table's integers and their per-row
qparams, gathers the rows the indices name and dequantizes only those, with the reference
module's arithmetic, so each row is bit for bit what the reference model computes::

    reference:  dequantize(table, row scales, row zero points) -> embedding(., ids)
    kernel:     table[ids] -> dequantize(., scales[ids], zero points[ids])

Float zero points (torch.ao's ``per_channel_affine_float_qparams``) and integer ones
(symmetric int8 rows) alike. Declined, with the reason: a per-tensor table, ``max_norm``
(the lookup renormalizes the float table in place), 4-bit tables. ``EmbeddingBag`` stays in
reference form (no rule).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from fxquant.lowering import Declined, LoweringMatch, LoweringRule
from fxquant.nn import reference
from fxquant.numerics import qdq
from torch import nn

__all__ = ["EmbeddingLookup", "build_embedding", "embedding_rule"]

_TABLE_DTYPES = (torch.uint8, torch.int8)


class EmbeddingLookup(nn.Module):
    """Rows of an integer table, dequantized with their own scale and zero point.

    Example:
        >>> ref = reference.Embedding.from_float(nn.Embedding(4, 2), {
        ...     "qscheme": "per_channel_affine_float_qparams", "dtype": torch.uint8,
        ...     "scale": torch.full((4,), 0.1), "zero_point": torch.full((4,), 128.0), "axis": 0})
        >>> ids = torch.tensor([[3, 0]])
        >>> torch.equal(EmbeddingLookup(ref)(ids), ref(ids))
        True
    """

    def __init__(self, ref: reference.Embedding) -> None:
        super().__init__()
        qparams: dict[str, Any] = ref.get_weight_qparams()
        self.register_buffer("table", ref.get_quantized_weight())
        self.register_buffer("scale", torch.as_tensor(qparams["scale"]).reshape(-1))
        self.register_buffer("zero_point", torch.as_tensor(qparams["zero_point"]).reshape(-1))
        self.float_qparams = self.zero_point.is_floating_point()
        self.bounds = (int(qparams["quant_min"]), int(qparams["quant_max"]))
        self.out_dtype = ref.weight.dtype

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        """The dequantized rows ``indices`` names, shaped ``indices.shape + (dim,)``."""
        flat = indices.reshape(-1)
        # F.embedding gathers integer rows too, 15x faster than indexing on a BERT table
        rows = F.embedding(flat, self.table)
        scale, zero_point = self.scale[flat], self.zero_point[flat]
        if self.float_qparams:
            # the reference's float-zero-point dequantize, row by row, in one fresh tensor
            values = rows.to(torch.float32)
            values.sub_(zero_point.float().unsqueeze(1)).mul_(scale.float().unsqueeze(1))
            values = values.to(self.out_dtype)
        else:
            low, high = self.bounds
            values = qdq.dequantize_per_channel(
                rows, scale, zero_point, 0, low, high, self.table.dtype, out_dtype=self.out_dtype
            )
        return values.reshape(*indices.shape, self.table.shape[1])


def build_embedding(match: LoweringMatch) -> nn.Module | Declined | None:
    """The lookup kernel for a reference ``Embedding``, or why it stays in reference form.

    Example:
        >>> build_embedding.__name__
        'build_embedding'
    """
    (module,) = match.modules
    if not isinstance(module, reference.Embedding) or not module.is_weight_quantized():
        return None
    qparams = module.get_weight_qparams()
    if qparams.get("axis") != 0:
        return Declined(f"table quantized with qscheme {qparams.get('qscheme')!r}, not per row")
    if module.max_norm is not None:
        return Declined("max_norm renormalizes the float table in place at each lookup")
    if module.get_quantized_weight().dtype not in _TABLE_DTYPES:
        return Declined(f"{qparams.get('dtype')} tables: only uint8 and int8 rows are looked up")
    return EmbeddingLookup(module)


def embedding_rule(backend: str) -> LoweringRule:
    """The backend's rule for reference ``Embedding`` (named ``{backend}_embedding_lookup``).

    Example:
        >>> embedding_rule("fbgemm").name
        'fbgemm_embedding_lookup'
    """
    return LoweringRule(
        reference.Embedding, build=build_embedding, name=f"{backend}_embedding_lookup"
    )
