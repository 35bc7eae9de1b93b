"""Parity with the authors' public code: recordings of their modules' outputs, and converters of their weights.

The kit never contains the authors' code. ``python -m idckit.parity record`` imports their modules from checkouts
named on the command line, builds each at a tiny size with a fixed seed on CPU and saves the state_dict, inputs and
outputs as small ``.pt`` files (``tests/parity/``). The parity tests load a recording, convert its weights with
the functions here (the same ones ``idckit import-checkpoint`` uses for released checkpoints) and assert that the
kit's module computes the same numbers. One module per family: :mod:`idckit.parity.pcl` (IDC-PCL, ``clver/`` and
``bird/``) and :mod:`idckit.parity.clip4idc`.
"""
