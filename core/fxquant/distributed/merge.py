"""Old path of the optional part :mod:`fxquant_distributed.merge` (distribution ``fxquant-distributed.merge``): importing it
warns and gives that module, or names the distribution to install when it is missing."""

from fxquant.moved import redirect

redirect(__name__)
