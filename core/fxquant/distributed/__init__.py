"""Old path of the optional part :mod:`fxquant_distributed` (distribution ``fxquant-distributed``): importing it
warns and gives that package, or names the distribution to install when it is missing."""

from fxquant.moved import redirect

redirect(__name__)
