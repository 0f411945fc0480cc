"""Old path of :mod:`fxquant.patterns.generic`.

Importing it warns (DeprecationWarning) and gives that module.
"""

from fxquant.moved import redirect

redirect(__name__)
