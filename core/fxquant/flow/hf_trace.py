"""Old path of :mod:`fxquant_transformers`, in the optional distribution ``fxquant-transformers``.

Importing it warns (DeprecationWarning) and gives that module, or names the distribution
to install when it is missing.
"""

from fxquant.moved import redirect

redirect(__name__)
