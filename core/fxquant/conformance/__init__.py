"""Old path of :mod:`fxquant.tools.conformance`: importing it warns and gives that package."""

from fxquant.moved import redirect

redirect(__name__)
