"""Old path of :mod:`fxquant.tools.conformance.configs`: importing it warns and gives that module."""

from fxquant.moved import redirect

redirect(__name__)
