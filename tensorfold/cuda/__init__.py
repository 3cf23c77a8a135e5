"""The kernel families: in each file the NumPy twin and, beside it, the `@cuda.jit` kernel it mirrors.

A twin is written in the shape its kernel takes: the loop one GPU thread runs is the loop in the twin, and every
reduction follows the fixed tree the kernel uses, so that both give the same bits. All arithmetic is float32;
multiply-adds and transcendental functions go through `fmath`, which rounds the same way on every side.
"""
