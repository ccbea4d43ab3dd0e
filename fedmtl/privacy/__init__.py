"""Differential privacy and secure aggregation (docs/privacy.md).

- :mod:`fedmtl.privacy.mechanisms`: clipping, Gaussian noise, adaptive clipping (pure);
- :mod:`fedmtl.privacy.accounting`: ε and z from Opacus's RDP and PRV accountants;
- :mod:`fedmtl.privacy.secagg`: secure aggregation simulated in a fixed-point ring (pure);
- :mod:`fedmtl.privacy.server`: what a sum-only server step does under central DP or SecAgg;
- :mod:`fedmtl.privacy.dpsgd`: sample-level DP-SGD with Opacus;
- :mod:`fedmtl.privacy.run`: the engine's one object for a run's privacy.

Nothing is imported here: the method modules import :mod:`fedmtl.privacy.server`, and the
quick commands must not pull in Opacus (tests/test_startup.py).
"""
