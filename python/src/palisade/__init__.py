"""palisade: run code that AI agents write inside a kernel-enforced sandbox.

Subpackages: ``palisade.ray`` spreads runs over a Ray cluster, one ``palisade serve`` per node
(install with ``pip install 'palisade[ray]'``).
"""
