"""Datasets in their released on-disk layouts (CLEVR-Change, Spot-the-Diff, Image-Editing-Request, the birds), their
loaders, the grid features and pixel caches models read, and the tensors IDC-PCL and DUDA train on."""
