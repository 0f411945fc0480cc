"""Old path of :mod:`fxquant.lowering.lower`: importing it warns and gives that module."""

from fxquant.moved import redirect

redirect(__name__)
