"""One fresh process of the registration race (#18): run as a script, prints True when kept.

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


start = threading.Barrier(8)


def register():
    start.wait()
    r.register_plugin(P(), backend="mine")


def listing():
    start.wait()
    r.list_backends()


threads = [threading.Thread(target=register)] + [threading.Thread(target=listing) for _ in range(7)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("mine" in r.list_backends())
