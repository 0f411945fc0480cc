"""transformers models built from small configs, random weights, nothing downloaded (issue 20).

Each builder gives the model class a user would load (``BertModel``, ``GPT2Model``,
``T5EncoderModel``, ``ViTModel``, ...) at toy sizes: 2 layers, hidden 64, 4 heads,
vocabulary 256. Text models take ``input_ids`` alone (2 x 16), as
``prepare_fx(model, mapping, (input_ids,))`` does; ViT, Swin and ConvNeXt take
2 x 3 x 32 x 32 pixels, Wav2Vec2 2 x 400 audio samples.
:func:`concrete_graph` gives torch.ao (which cannot trace these models) transformers'
own graph with its shapes made constants.

Example:
    >>> model = BUILDERS["bert"]()
    >>> model(torch.zeros(1, 16, dtype=torch.long)).last_hidden_state.shape
    torch.Size([1, 16, 64])
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

from tests.zoo import torchvision_models

__all__ = ["BUILDERS", "concrete_graph"]

VOCAB, HIDDEN, LAYERS, HEADS, FFN = 256, 64, 2, 4, 128


def _transformers() -> Any:
    # transformers imports torchvision where it is installed (image processors, Wav2Vec2),
    # which fails on the CPU torch unless its op schemas are defined first
    with contextlib.suppress(ImportError):
        torchvision_models.load()
    return importlib.import_module("transformers")


def _text(config: str, model: str, **overrides: Any) -> Callable[..., nn.Module]:
    def build(**options: Any) -> nn.Module:
        # options: more config fields (attn_implementation="eager": transformers' default
        # is sdpa where the model has it)
        t = _transformers()
        kwargs: dict[str, Any] = dict(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            intermediate_size=FFN,
            max_position_embeddings=64,
            initializer_range=0.1,
        )
        kwargs.update(overrides)
        kwargs.update(options)
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        return getattr(t, model)(getattr(t, config)(**kwargs)).eval()

    return build


BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "bert": _text("BertConfig", "BertModel"),
    "distilbert": _text(
        "DistilBertConfig",
        "DistilBertModel",
        hidden_size=None,
        num_hidden_layers=None,
        num_attention_heads=None,
        intermediate_size=None,
        dim=HIDDEN,
        n_layers=LAYERS,
        n_heads=HEADS,
        hidden_dim=FFN,
    ),
    "roberta": _text("RobertaConfig", "RobertaModel", pad_token_id=1),
    "albert": _text("AlbertConfig", "AlbertModel", embedding_size=32),
    "electra": _text("ElectraConfig", "ElectraModel", embedding_size=32),
    "gpt2": _text(
        "GPT2Config",
        "GPT2Model",
        hidden_size=None,
        num_hidden_layers=None,
        num_attention_heads=None,
        intermediate_size=None,
        max_position_embeddings=None,
        n_embd=HIDDEN,
        n_layer=LAYERS,
        n_head=HEADS,
        n_positions=64,
    ),
    "t5_encoder": _text(
        "T5Config",
        "T5EncoderModel",
        hidden_size=None,
        num_hidden_layers=None,
        num_attention_heads=None,
        intermediate_size=None,
        max_position_embeddings=None,
        d_model=HIDDEN,
        d_kv=HIDDEN // HEADS,
        d_ff=FFN,
        num_layers=LAYERS,
        num_heads=HEADS,
        initializer_factor=1.0,
        initializer_range=None,
    ),
    "hf_vit": _text(
        "ViTConfig",
        "ViTModel",
        vocab_size=None,
        max_position_embeddings=None,
        image_size=32,
        patch_size=4,
        add_pooling_layer=None,
    ),
    "mobilebert": _text(
        "MobileBertConfig",
        "MobileBertModel",
        embedding_size=32,
        intra_bottleneck_size=32,
        true_hidden_size=32,
        num_feedforward_networks=2,
    ),
    "hf_swin": _text(
        "SwinConfig",
        "SwinModel",
        vocab_size=None,
        hidden_size=None,
        num_hidden_layers=None,
        num_attention_heads=None,
        intermediate_size=None,
        max_position_embeddings=None,
        image_size=32,
        patch_size=4,
        embed_dim=32,
        depths=[2, 2],
        num_heads=[2, 4],
        window_size=4,
    ),
    "hf_convnext": _text(
        "ConvNextConfig",
        "ConvNextModel",
        vocab_size=None,
        hidden_size=None,
        num_hidden_layers=None,
        num_attention_heads=None,
        intermediate_size=None,
        max_position_embeddings=None,
        image_size=32,
        patch_size=4,
        num_stages=2,
        hidden_sizes=[32, 64],
        depths=[1, 1],
    ),
    "wav2vec2": _text(
        "Wav2Vec2Config",
        "Wav2Vec2Model",
        vocab_size=32,
        max_position_embeddings=None,
        conv_dim=(32, 32),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
    ),
}
"""Every transformers model of the zoo, by name: a function building it (eval mode); its
keyword arguments set more config fields (``BUILDERS["bert"](attn_implementation="eager")``)."""


def concrete_graph(
    model: nn.Module, inputs: tuple[torch.Tensor, ...], names: list[str]
) -> fx.GraphModule:
    """``model`` traced by transformers' tracer, every non-tensor value made a constant.

    torch.ao's ``prepare_fx`` traces its input again with a plain tracer, which fails on
    transformers' graph (a buffer sliced by a traced length, ``torch.finfo`` of a traced
    dtype); with sizes, dtypes and numbers constant it traces, at the shapes of ``inputs``
    only (``bench/models.concrete_graph`` names BERT's inputs and calls this).
    """
    from transformers.utils import fx as hf_fx

    if type(model).__name__ == "GPT2Model":
        gm = _fxquant_graph(model, inputs)
    else:
        gm = hf_fx.symbolic_trace(model, input_names=names)
    values: dict[fx.Node, object] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> object:
            values[n] = result = super().run_node(n)
            return result

    Recorder(gm).run(*inputs)
    constant = (int, float, bool, torch.dtype, torch.Size, torch.finfo)
    for node in gm.graph.nodes:
        value = values.get(node)
        if node.op not in ("placeholder", "output") and isinstance(value, constant):
            node.replace_all_uses_with(value)  # type: ignore[arg-type]  # fx takes constants
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _fxquant_graph(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> fx.GraphModule:
    """GPT-2 as fxquant's trace step captures it: transformers' own tracer fails on its
    vmap-built causal mask, and fxquant's gives its Conv1D layers as Linear (the same
    recipe for torch.ao, which would otherwise keep them float as ``addmm``)."""
    from fxquant.config.backend import BackendConfig
    from fxquant.flow.context import FlowContext
    from fxquant.flow.trace import trace
    from fxquant.registry.resolution import ResolvedBackend

    gm = trace(model, FlowContext(ResolvedBackend(BackendConfig("graph")), example_inputs=inputs))
    for node in gm.graph.nodes:
        node.meta.pop("fxquant", None)  # torch.ao's graph: none of fxquant's records
    return gm
