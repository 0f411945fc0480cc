"""One fresh process of the registration race (#18): run as a script, prints True when kept.

Only under ``__main__``: pytest imports every module under tests/ to collect doctests, and a
registration at import would leak backend "mine" into the whole run.

One thread registers a plugin for backend "mine" while seven list the backends, all
released at once on a cold process (no registry yet). tests/registry/test_threads.py
runs it in fresh processes; ``nox -s fuzz`` runs 100.
"""

import threading

import fxquant.registry as r


class P:
    @r.hookimpl
    def fxquant_pattern_configs(self, backend):
        return []


def main() -> None:
    start = threading.Barrier(8)

    def register() -> None:
        start.wait()
        r.register_plugin(P(), backend="mine")

    def listing() -> None:
        start.wait()
        r.list_backends()

    threads = [threading.Thread(target=register)]
    threads += [threading.Thread(target=listing) for _ in range(7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("mine" in r.list_backends())


if __name__ == "__main__":
    main()
