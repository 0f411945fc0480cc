"""Old path of :mod:`fxquant.flow.equalization.prepare`.

Importing it warns (DeprecationWarning) and gives that module.
"""

from fxquant.moved import redirect

redirect(__name__)
