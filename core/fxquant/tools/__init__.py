"""The tools around the mechanism: nothing in the flow, configs or registry imports them.

    cli.py          the ``fxquant`` command: backends | show NAME | demo | check NAME | new NAME
    tables.py       markdown tables for the command's output (demo, check, show)
    describe.py     a backend's pattern table, in words (``fxquant show``)
    demo.py         ``fxquant demo``: every installed backend on a built-in model
    conformance/    ``fxquant check NAME``: the plugin contract, checked on a backend
    testing.py      the test kit for backend plugin authors (single-op lowering cases)
    scaffold.py     ``fxquant new NAME``: a plugin package that passes ``fxquant check``
    debug/          the numerics debugger (``compare``) and float fallback (``fallback``,
                    ``Budget``): tools over the flow, documented as ``fxquant.numerics.*``
    export.py       ``torch.export`` of a converted model, weights folded into integers: the
                    input of deployment toolchains (ExecuTorch, ONNX)
    calibration.py  ``calibrate``: the calibration loop, with progress on long runs
    checkpoint.py   ``save_checkpoint``/``load_checkpoint``: state dicts verified on load
    progress.py     a progress bar (tqdm) or plain lines on long runs
    quiet.py        third-party start-up chatter kept out of fxquant's output

Their old paths are files that warn and give these modules (:mod:`fxquant.moved`):
``fxquant.cli``, ``fxquant.testing``, ``fxquant.conformance``, ``fxquant.export`` (old paths).
``from fxquant.numerics import compare, fallback`` gives the debugger.
"""
