"""The models: IDC-PCL, CLIP4IDC (on open_clip), the DUDA baseline, and decoding shared by all captioners."""
