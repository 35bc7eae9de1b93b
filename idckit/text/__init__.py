"""Text: the IDC-PCL word vocabulary, part-of-speech tagging and FDA's hard negatives."""
