"""Triton kernels, one version per file: v1 -> v4 retell the seed's journey, final is what users call."""
