"""The ``training`` flag of a model traced in training mode (``prepare_qat_fx``).

Symbolic tracing runs ``forward`` once and keeps what it did. A module that reads
``self.training`` then had the mode it was traced in frozen into the graph: torchvision's
``stochastic_depth(x, p, mode, self.training)`` and transformers'
``F.dropout(w, p, training=self.training)`` kept dropping after ``eval()``, so the converted
model of a QAT run dropped residual branches and attention weights at random (the lowered and
the reference model of an EfficientNet were up to 255 steps apart, neither right); a branch
``if self.training: mask = torch.empty(x.shape)...`` could not be traced at all.

While a training-mode model is traced, each module whose ``forward`` is traced (not a leaf)
reads :data:`MODE` as its ``training``:

- passed to a call (``F.dropout(..., training=self.training)``), it becomes the graph
  module's own ``training`` attribute, a ``get_attr`` node: the call drops in training mode
  and passes its input on after ``eval()``, in the prepared and the converted model alike;
- asked as a condition (``if self.training:``), it is false: the graph takes the branch the
  converted model runs, the one ``eval()`` runs. A training-only branch (transformers'
  SpecAugment masks, a layer drop, a stochastic depth written as an ``if``) then does not
  run during QAT: QAT trains the deterministic network it deploys, as a graph cannot hold
  both sides of a Python ``if``.

The modules' own flags are put back when the trace ends (they are the flow's copy anyway).

An eval-mode trace freezes ``training=False`` into the call instead: torchvision's
``stochastic_depth(x, p, mode, False)`` (EfficientNet, ConvNeXt, Swin) is then its input,
whatever mode the model is put in later. :func:`drop_eval_identities` removes those calls,
as the identity they are, so the conv before and the add after fuse and quantize as they do
without one (an eval ``nn.Dropout`` is a leaf module, which lowering drops).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from torch import fx, nn

__all__ = ["MODE", "ModeFlag", "carries_mode", "drop_eval_identities", "mode_flags"]

MODE_ATTRIBUTE = "training"
"""The graph module attribute the flag's node reads (``nn.Module.training``)."""


class ModeFlag:
    """What ``self.training`` reads while a training-mode model is traced (see the module).

    Example:
        >>> bool(MODE), repr(MODE)
        (False, 'training')
    """

    __slots__ = ()

    def __bool__(self) -> bool:
        return False  # a Python branch takes the side eval() takes: the deployed one

    def __repr__(self) -> str:
        return MODE_ATTRIBUTE

    def __deepcopy__(self, memo: dict[int, Any]) -> ModeFlag:
        return self  # one flag: a module copied while tracing still reads it


MODE = ModeFlag()


def carries_mode(args: Any, kwargs: Any) -> bool:
    """Whether a call's arguments hold :data:`MODE` (at any depth of tuples, lists, dicts).

    Example:
        >>> carries_mode((1, [MODE]), {}), carries_mode((True,), {"training": False})
        (True, False)
    """
    values: list[Any] = []
    fx.node.map_aggregate((args, kwargs), values.append)
    return any(value is MODE for value in values)


@contextlib.contextmanager
def mode_flags(root: nn.Module, is_leaf: Callable[[nn.Module, str], bool]) -> Iterator[None]:
    """Every traced module of ``root`` (not a leaf) reads :data:`MODE` as its ``training``
    inside the block; each gets its own flag back after it.

    Example:
        >>> net = nn.Sequential(nn.Linear(1, 1))
        >>> with mode_flags(net, lambda m, path: isinstance(m, nn.Linear)):
        ...     net.training, net[0].training
        (training, True)
        >>> net.training
        True
    """
    patched = []
    for path, module in root.named_modules():
        if module.training is True and not is_leaf(module, path):
            module.__dict__[MODE_ATTRIBUTE] = MODE
            patched.append(module)
    try:
        yield
    finally:
        for module in patched:
            if module.__dict__.get(MODE_ATTRIBUTE) is MODE:
                module.__dict__[MODE_ATTRIBUTE] = True


# wrapped calls (kept whole by the tracer) that return their input when ``training`` is
# False: (module, name) -> the position of ``training``
_IDENTITY_UNLESS_TRAINING = {("torchvision.ops.stochastic_depth", "stochastic_depth"): 3}


def _frozen_eval_identity(node: fx.Node) -> bool:
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], fx.Node):
        return False
    key = (getattr(node.target, "__module__", ""), getattr(node.target, "__name__", ""))
    position = _IDENTITY_UNLESS_TRAINING.get(key)
    if position is None:
        return False
    given = node.args[position] if len(node.args) > position else True
    return node.kwargs.get("training", given) is False


def drop_eval_identities(gm: fx.GraphModule) -> int:
    """Remove the calls an eval-mode trace froze into the identity (see the module); returns
    how many, and recompiles ``gm`` when there was any.

    Example:
        >>> drop_eval_identities(fx.symbolic_trace(nn.Dropout().eval()))
        0
    """
    dropped = [node for node in gm.graph.nodes if _frozen_eval_identity(node)]
    for node in dropped:
        node.replace_all_uses_with(node.args[0])
        gm.graph.erase_node(node)
    if dropped:
        gm.recompile()
    return len(dropped)
