"""Leaf rewrites: tracing through PyTorch's own transformer modules.

    nn.MultiheadAttention ----------> in_proj (Linear, packed) -> heads -> attention -> out_proj
    nn.TransformerEncoderLayer -----> self_attn + dropout/norm, linear1 -> activation -> linear2
    nn.TransformerDecoderLayer -----> self_attn, multihead_attn (cross), feed-forward
    nn.TransformerEncoder/Decoder --> their layers in turn, then ``norm``
    nn.Transformer -----------------> encoder(src) then decoder(tgt, memory)

torch's transformer modules cannot be traced symbolically: their ``forward``
first decides whether to take the inference fast path (``torch._transformer_encoder_layer_fwd``,
nested tensors), asking tensors for their dtype, device and ``is_nested`` and
comparing masks, which a Proxy cannot answer. They are also torch.nn modules,
so torch.fx keeps them as single (float) calls. While tracing, the
:class:`~fxquant.flow.trace.QuantizationTracer` replaces the ``forward`` of
these modules by the functions below: the slow path the module computes
anyway outside that shortcut, written in plain ops (``F.linear``,
``unflatten``/``transpose``, ``matmul``/``softmax``/``matmul``, dropout, and the
module's own ``Linear``/``LayerNorm`` children), so the projections and
feed-forward layers become ordinary ``Linear``/``F.linear`` patterns that every
backend quantizes. In eval mode the
traced graph computes what the module computes (float rounding aside); the
fast path is an inference shortcut with the same numbers, except that it
writes zeros at padded positions of ``src_key_padding_mask`` where this path
(like the module in training mode) leaves the attention over the valid keys.

Rules a user relies on:

* the rewrite applies to torch's classes and to subclasses that keep torch's
  ``forward``; a subclass with a ``forward`` of its own is traced as any module;
* a module configured as a leaf (``set_non_traceable_module_classes``/``names``,
  a standalone or a custom module) stays one call, as before;
* ``MultiheadAttention`` with ``bias_k``/``bias_v`` or ``add_zero_attn`` stays
  one float call (rare options, not rewritten);
* masks are prepared at run time (bool or float, any rank torch accepts) by
  :func:`attention_mask`, a float node; the ``is_causal`` hints are honoured
  through the mask itself, which torch requires with them;
* the attention dropout is an ``nn.Dropout`` child of the flow's copy
  (``attn_dropout``): it drops in training mode only, as the module, so a QAT
  model put in ``eval()`` stops dropping (a model the flow could not copy gets
  ``F.dropout`` in the mode it was traced in).
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

__all__ = [
    "add_mask",
    "attention_mask",
    "decoder",
    "decoder_layer",
    "encoder",
    "encoder_layer",
    "leaf_rewrite",
    "multihead_attention",
    "root_concrete_args",
    "split_projections",
    "traceable_root",
    "transformer",
]

Rewrite = Callable[..., Any]
Arguments = Mapping[str, Any]  # a call's arguments by parameter name


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or one call_function node when an argument is a Proxy."""
    for arg in args:
        if isinstance(arg, fx.Proxy):
            return arg.tracer.create_proxy("call_function", fn, args, {})
    return fn(*args)


def attention_mask(
    attn_mask: Tensor | None, key_padding_mask: Tensor | None, q: Tensor, num_heads: int
) -> Tensor:
    """One additive float mask for attention scores of shape ``(..., heads, L, S)``.

    A mask given as a model input may be None when the model runs: with both None
    the mask is a single zero (the scores unchanged), so the graph's ``+ mask`` holds.

    ``attn_mask`` is ``(L, S)`` or ``(batch * heads, L, S)`` (``(heads, L, S)``
    unbatched), ``key_padding_mask`` is ``(batch, S)`` (``(S,)`` unbatched);
    a bool mask marks the positions *not* attended (they become ``-inf``), a
    float mask is added as it is, as in ``nn.MultiheadAttention``.

    Example:
        >>> q = torch.zeros(2, 4, 3, 8)  # batch, heads, L, head_dim
        >>> m = attention_mask(None, torch.tensor([[False, True], [False, False]]), q, 4)
        >>> m.shape, m[0, 0, 0].tolist()
        (torch.Size([2, 1, 1, 2]), [0.0, -inf])
    """
    mask = None
    if attn_mask is not None:
        mask = _additive(attn_mask, q.dtype)
        if mask.dim() == 3 and q.dim() == 4:  # (batch * heads, L, S) -> (batch, heads, L, S)
            mask = mask.view(-1, num_heads, *mask.shape[1:])
    if key_padding_mask is not None:
        padding = _additive(key_padding_mask, q.dtype).unsqueeze(-2).unsqueeze(-2)
        mask = padding if mask is None else mask + padding
    return torch.zeros(1, dtype=q.dtype, device=q.device) if mask is None else mask


def add_mask(scores: Tensor, mask: Tensor) -> Tensor:
    """``scores + mask``, as a node of its own: never a quantized add pattern.

    Example:
        >>> add_mask(torch.zeros(2), torch.tensor([0.0, float("-inf")])).tolist()
        [0.0, -inf]
    """
    return scores + mask


def _additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    if mask.dtype == torch.bool:
        return torch.zeros_like(mask, dtype=dtype).masked_fill(mask, float("-inf"))
    return mask.to(dtype)


def _heads(x: Any, num_heads: int, batch_first: bool) -> Any:
    """``(L, N, E)``, ``(N, L, E)``, ``(L, E)`` -> ``(N, heads, L, dim)``, ``(heads, L, dim)``."""
    x = x.unflatten(-1, (num_heads, -1))
    return x.transpose(-3, -2) if batch_first else x.movedim(0, -2)


def _merge_heads(x: Any, batch_first: bool) -> Any:
    x = x.transpose(-3, -2) if batch_first else x.movedim(-2, 0)
    return x.flatten(-2)


def _projections(m: nn.MultiheadAttention, query: Any, key: Any, value: Any) -> tuple[Any, ...]:
    """q, k, v: one ``Linear`` on the packed in_proj weight for self-attention."""
    e = m.embed_dim
    if not m._qkv_same_embed_dim:
        bias = m.in_proj_bias
        biases = (None,) * 3 if bias is None else (bias[:e], bias[e : 2 * e], bias[2 * e :])
        weights = (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight)
        return tuple(
            F.linear(x, w, b) for x, w, b in zip((query, key, value), weights, biases, strict=True)
        )
    packed = m._modules.get(IN_PROJ)  # the Linear split_projections added, if any
    if query is key and key is value:
        qkv = (
            packed(query)
            if packed is not None
            else F.linear(query, m.in_proj_weight, m.in_proj_bias)
        )
        return tuple(qkv.narrow(-1, i * e, e) for i in range(3))
    weight, bias = m.in_proj_weight, m.in_proj_bias
    q = F.linear(query, weight[:e], None if bias is None else bias[:e])
    if key is value:  # cross-attention: one linear for keys and values
        kv = F.linear(key, weight[e:], None if bias is None else bias[e:])
        return q, kv.narrow(-1, 0, e), kv.narrow(-1, e, e)
    k = F.linear(key, weight[e : 2 * e], None if bias is None else bias[e : 2 * e])
    v = F.linear(value, weight[2 * e :], None if bias is None else bias[2 * e :])
    return q, k, v


IN_PROJ = "in_proj"
"""The child :func:`split_projections` gives a MultiheadAttention: its packed in-projection."""
ATTN_DROPOUT = "attn_dropout"
"""Its ``nn.Dropout`` on the attention weights (follows ``train()``/``eval()``)."""


def split_projections(m: nn.Module) -> list[tuple[str, nn.Module]]:
    """Give the flow's own copy of a MultiheadAttention ``Linear`` children; returns the new ones.

    ``in_proj`` is an ``nn.Linear`` whose weight and bias *are* ``in_proj_weight``
    and ``in_proj_bias`` (the same Parameters, no copy), and ``out_proj`` (torch's
    ``NonDynamicallyQuantizableLinear``, a Linear with another name) is typed
    ``nn.Linear``: both then match every backend's Linear patterns and lower to
    its prepacked int8 kernels. ``attn_dropout``, an ``nn.Dropout`` with the
    module's ``dropout``, drops attention weights in training mode only, as the
    module (QAT then ``eval()``). Only ever called on modules the flow owns.

    Example:
        >>> mha = nn.MultiheadAttention(8, 2)
        >>> [name for name, _ in split_projections(mha)], mha.in_proj.weight is mha.in_proj_weight
        (['in_proj'], True)
        >>> type(mha.out_proj).__name__
        'Linear'
    """
    if not isinstance(m, nn.MultiheadAttention) or leaf_rewrite(m) is None:
        return []
    if type(m.out_proj) is nn.modules.linear.NonDynamicallyQuantizableLinear:
        m.out_proj.__class__ = nn.Linear  # type: ignore[assignment]  # no state of its own
    added: list[tuple[str, nn.Module]] = []
    if m.dropout > 0.0 and ATTN_DROPOUT not in m._modules:
        # bool(): while a training-mode model is traced, m.training is the mode flag
        # (flow.mode_flag); the traced graph module's train() sets the child's mode after
        dropout = nn.Dropout(m.dropout).train(bool(m.training))
        m.add_module(ATTN_DROPOUT, dropout)
        added.append((ATTN_DROPOUT, dropout))
    if not m._qkv_same_embed_dim or IN_PROJ in m._modules:
        return added
    # _parameters, not attributes: while tracing, torch.fx answers those with proxies
    weight, bias = m._parameters["in_proj_weight"], m._parameters["in_proj_bias"]
    packed = nn.Linear(m.embed_dim, 3 * m.embed_dim, bias=bias is not None, device="meta")
    packed.weight, packed.bias = weight, bias  # type: ignore[assignment]
    m.add_module(IN_PROJ, packed)
    return [*added, (IN_PROJ, packed)]


def multihead_attention(  # noqa: PLR0913, PLR0917 (torch's forward signature)
    m: nn.MultiheadAttention,
    query: Any,
    key: Any,
    value: Any,
    key_padding_mask: Any = None,
    need_weights: bool = True,
    attn_mask: Any = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
) -> tuple[Any, Any]:
    """``nn.MultiheadAttention.forward`` in plain ops (see the module docstring).

    Example:
        >>> mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
        >>> x = torch.randn(3, 5, 8)
        >>> out, w = multihead_attention(mha, x, x, x)
        >>> torch.allclose(out, mha(x, x, x)[0], atol=1e-6), w.shape
        (True, torch.Size([3, 5, 5]))
    """
    if is_causal and attn_mask is None:  # torch's own rule: the hint needs the mask
        msg = "MultiheadAttention: is_causal=True needs attn_mask (the causal mask itself)"
        raise RuntimeError(msg)
    heads, batch_first = m.num_heads, m.batch_first
    q, k, v = (_heads(t, heads, batch_first) for t in _projections(m, query, key, value))
    mask = None
    if attn_mask is not None or key_padding_mask is not None:
        mask = _call(attention_mask, attn_mask, key_padding_mask, q, heads)
    # written out (not one scaled_dot_product_attention call): ExecuTorch's runtime lacks
    # kernels for SDPA's decomposition, and x86/onednn fuse these ops back into SDPA
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(m.head_dim))
    if mask is not None:  # one float node: a backend quantizing adds must not round -inf
        scores = _call(add_mask, scores, mask)
    weights: Any = F.softmax(scores, dim=-1)  # None below when need_weights=False
    module_dropout = m._modules.get(ATTN_DROPOUT)
    if module_dropout is not None:  # the child split_projections added: follows eval()
        attended = module_dropout(weights)
    else:
        attended = F.dropout(weights, p=m.dropout) if m.training and m.dropout > 0.0 else weights
    out = torch.matmul(attended, v)
    if not need_weights:
        weights = None
    elif average_attn_weights:
        weights = weights.mean(dim=-3)
    out = _merge_heads(out, batch_first)
    if type(m.out_proj) is nn.Linear:  # split_projections typed it: one Linear pattern
        out = m.out_proj(out)
    else:
        out = F.linear(out, m.out_proj.weight, m.out_proj.bias)
    return out, weights


def _residuals(norm_first: bool, x: Any, blocks: tuple[tuple[Any, Rewrite], ...]) -> Any:
    """Each ``(norm, block)`` of a layer around its residual add, pre-norm or post-norm."""
    for norm, block in blocks:
        x = x + block(norm(x)) if norm_first else norm(x + block(x))
    return x


def _attend(attention: nn.Module, dropout: nn.Module, x: Any, memory: Any, masks: Any) -> Any:
    """One attention block of a layer: ``dropout(attention(x, memory, memory))``."""
    mask, padding = masks
    out = attention(
        x, memory, memory, attn_mask=mask, key_padding_mask=padding, need_weights=False
    )[0]
    return dropout(out)


def _feed_forward(m: Any, dropout: nn.Module, x: Any) -> Any:
    return dropout(m.linear2(m.dropout(m.activation(m.linear1(x)))))


# torch's module class -> the function traced in its place (:func:`leaf_rewrite`). The hints
# (is_causal...) are not passed on: the mask they describe is always applied, which gives the
# numbers of the hinted kernels
_REWRITES: dict[type[nn.Module], Rewrite] = {nn.MultiheadAttention: multihead_attention}


def _rewrite_of(cls: type[nn.Module]) -> Callable[[Callable[[Any, Arguments], Any]], Rewrite]:
    """Make ``body(m, arguments)`` the rewrite of ``cls``, taking the arguments of ``cls.forward``.

    The rewrite binds what it is given by torch's own signature (defaults applied), so
    ``body`` reads each argument by its name; its ``__wrapped__`` is ``cls.forward``,
    whose parameters torch.fx (``inspect.unwrap``) and :func:`root_concrete_args`
    read, so a rewritten root gets the placeholders of torch's signature.
    """
    signature = inspect.signature(cls.forward)

    def decorate(body: Callable[[Any, Arguments], Any]) -> Rewrite:
        def rewrite(m: Any, *args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(m, *args, **kwargs)
            bound.apply_defaults()
            return body(m, bound.arguments)

        functools.update_wrapper(rewrite, body)
        rewrite.__wrapped__ = cls.forward  # type: ignore[attr-defined]  # read by inspect.unwrap
        _REWRITES[cls] = rewrite
        return rewrite

    return decorate


@_rewrite_of(nn.TransformerEncoderLayer)
def encoder_layer(m: nn.TransformerEncoderLayer, a: Arguments) -> Any:
    """``nn.TransformerEncoderLayer.forward`` without its fast-path checks."""
    masks = (a["src_mask"], a["src_key_padding_mask"])
    return _residuals(
        m.norm_first,
        a["src"],
        (
            (m.norm1, lambda x: _attend(m.self_attn, m.dropout1, x, x, masks)),
            (m.norm2, lambda x: _feed_forward(m, m.dropout2, x)),
        ),
    )


@_rewrite_of(nn.TransformerDecoderLayer)
def decoder_layer(m: nn.TransformerDecoderLayer, a: Arguments) -> Any:
    """``nn.TransformerDecoderLayer.forward`` (self-attention, cross-attention, feed-forward)."""
    own = (a["tgt_mask"], a["tgt_key_padding_mask"])
    cross = (a["memory_mask"], a["memory_key_padding_mask"])
    return _residuals(
        m.norm_first,
        a["tgt"],
        (
            (m.norm1, lambda x: _attend(m.self_attn, m.dropout1, x, x, own)),
            (m.norm2, lambda x: _attend(m.multihead_attn, m.dropout2, x, a["memory"], cross)),
            (m.norm3, lambda x: _feed_forward(m, m.dropout3, x)),
        ),
    )


@_rewrite_of(nn.TransformerEncoder)
def encoder(m: nn.TransformerEncoder, a: Arguments) -> Any:
    """``nn.TransformerEncoder.forward``: the layers in turn (no nested-tensor shortcut)."""
    out = a["src"]
    for layer in m.layers:
        out = layer(out, src_mask=a["mask"], src_key_padding_mask=a["src_key_padding_mask"])
    return out if m.norm is None else m.norm(out)


# the masks torch's decoders pass on by keyword (a custom layer may take more)
_DECODER_MASKS = ("tgt_mask", "memory_mask", "tgt_key_padding_mask", "memory_key_padding_mask")


@_rewrite_of(nn.TransformerDecoder)
def decoder(m: nn.TransformerDecoder, a: Arguments) -> Any:
    """``nn.TransformerDecoder.forward``: the layers in turn, then ``norm``."""
    out = a["tgt"]
    for layer in m.layers:
        out = layer(out, a["memory"], **{name: a[name] for name in _DECODER_MASKS})
    return out if m.norm is None else m.norm(out)


@_rewrite_of(nn.Transformer)
def transformer(m: nn.Transformer, a: Arguments) -> Any:
    """``nn.Transformer.forward``: ``encoder(src)`` then ``decoder(tgt, memory)``."""
    memory = m.encoder(a["src"], mask=a["src_mask"], src_key_padding_mask=a["src_key_padding_mask"])
    return m.decoder(a["tgt"], memory, **{name: a[name] for name in _DECODER_MASKS})


def leaf_rewrite(module: nn.Module) -> Rewrite | None:
    """The function traced in place of ``module.forward``, or None (traced as usual).

    Example:
        >>> leaf_rewrite(nn.MultiheadAttention(8, 2)).__name__
        'multihead_attention'
        >>> leaf_rewrite(nn.Linear(2, 2)) is None
        True
    """
    cls = next((c for c in type(module).__mro__ if c in _REWRITES), None)
    if cls is None or type(module).forward is not cls.forward:
        return None  # not torch's, or the user's own forward: traced as written
    if isinstance(module, nn.MultiheadAttention) and (
        module.bias_k is not None or module.add_zero_attn
    ):
        return None  # rare options, not rewritten: one float call
    return _REWRITES[cls]


def root_concrete_args(
    module: nn.Module, n_inputs: int, given: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Concrete defaults for the optional arguments the example inputs leave out.

    A rewritten module traced as the root (``prepare_fx(encoder, ...)``) would
    otherwise get a placeholder for every mask; the ones not among the example
    inputs keep their default (None), as in a call from a parent's ``forward``.

    Example:
        >>> layer = nn.TransformerEncoderLayer(8, 2)
        >>> root_concrete_args(nn.TransformerEncoder(layer, 1, enable_nested_tensor=False), 1, None)
        {'mask': None, 'src_key_padding_mask': None, 'is_causal': None}
    """
    rewrite = leaf_rewrite(module)
    if rewrite is None:
        return given
    parameters = list(inspect.signature(rewrite).parameters.values())[1 + n_inputs :]
    defaults = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
    return {**defaults, **(given or {})}  # what the user fixed wins


def traceable_root(module: nn.Module) -> nn.Module:
    """``module`` itself, or for a rewritten root a shallow copy whose forward is the rewrite.

    torch.fx traces ``type(root).forward``; the copy shares the children and
    parameters and leaves ``module`` unchanged.

    Example:
        >>> layer = nn.TransformerEncoderLayer(8, 2)
        >>> enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        >>> root = traceable_root(enc)
        >>> type(root).forward is encoder, root.layers is enc.layers, type(enc).forward is encoder
        (True, True, False)
    """
    rewrite = leaf_rewrite(module)
    if rewrite is None:
        return module
    cls = type(module)
    shim = type(cls.__name__, (cls,), {"forward": rewrite, "__module__": cls.__module__})
    root = copy.copy(module)
    root.__class__ = shim
    return root
