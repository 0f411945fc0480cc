"""The tools around the mechanism (#21): nothing in the flow, configs or registry imports them.

    cli.py          the ``fxquant`` command: backends | show NAME | demo | check NAME | new NAME
    tables.py       markdown tables for the command's output (demo, check, show)
    describe.py     a backend's pattern table, in words (``fxquant show``)
    demo.py         ``fxquant demo``: every installed backend on a built-in model
    conformance/    ``fxquant check NAME``: the plugin contract, checked on a backend
    testing.py      the test kit for backend plugin authors (single-op lowering cases)
    scaffold.py     ``fxquant new NAME``: a plugin package that passes ``fxquant check``

Their old paths (``fxquant.cli``, ``fxquant.testing``, ``fxquant.conformance``...) keep
working (:mod:`fxquant.moved`).
"""
