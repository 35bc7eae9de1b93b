"""idckit: a notebook-first reproducibility kit for Image Difference Captioning.

Reproduces the tables of IDC-PCL (Yao, Wang, Jin, AAAI 2022) and CLIP4IDC (Guo, Wang, Laaksonen, AACL 2022)
on the real datasets where they are on disk, and on SynthCLEVR-Change (synthetic data in the real
CLEVR-Change layout) everywhere else. See README.md.
"""
__version__ = "0.1.0"
