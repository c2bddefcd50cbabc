#!/usr/bin/env python3
"""Reproducer: triton-jfa · metamorphic:key_shift (fail)

disagrees with the float64 oracle: out 1.5x the allowance

Check:    conformance/spec/test_metamorphic.py::test_metamorphic[triton-jfa-key_shift]
Problem:  Problem(seqlens_q=[0, 0, 1, 1, 1, 1, 0], seqlens_k=[0, 0, 0, 93, 192, 100, 192], heads_q=2, heads_kv=2, head_dim=16, dtype='bfloat16', causal='bottom_right', scale=1.0, length_law='decode', offsets_dtype='int64', values='outliers')
          (hypothesis's minimal counterexample)
Recorded: NVIDIA H100 80GB HBM3 (compute capability 9.0); python 3.12.3; torch 2.11.0, triton 3.6.0, flash-attn-4 4.0.0b36, flashinfer-python 0.7.2.post1, nvidia-cutlass-dsl 4.8.1
          jfa-conformance commit 18b2230e582d with uncommitted changes

Needs jfa-conformance and the backend's own package installed, nothing from the report directory:
    python test_metamorphic-triton-jfa-86a307d513.py                      exit 1: reproduced, 0: passes now, 2: cannot run here
    python test_metamorphic-triton-jfa-86a307d513.py --backend reference  the same problem on another backend
    python test_metamorphic-triton-jfa-86a307d513.py --device cuda:1      on another device

It reruns the check (test_metamorphic) on the problem as the run did and judges the result against
the float64 oracle.
"""
import os
import sys

REPRODUCER = {'backend': 'triton-jfa',
 'device': 'cuda',
 'check': 'test_metamorphic',
 'params': {'relation': 'key_shift'},
 'problem': {'seqlens_q': [0, 0, 1, 1, 1, 1, 0],
             'seqlens_k': [0, 0, 0, 93, 192, 100, 192],
             'heads_q': 2,
             'heads_kv': 2,
             'head_dim': 16,
             'head_dim_v': None,
             'dtype': 'bfloat16',
             'causal': 'bottom_right',
             'broadcast_q': False,
             'scale': 1.0,
             'seed': 0,
             'length_law': 'decode',
             'offsets_dtype': 'int64',
             'layout': 'packed',
             'offsets_layout': 'contiguous',
             'grad_layout': 'contiguous',
             'values': 'outliers'},
 'mode': 'check',
 'gradients': False,
 'nodeid': 'conformance/spec/test_metamorphic.py::test_metamorphic[triton-jfa-key_shift]',
 'outcome': 'fail'}

if __name__ == "__main__":
    # a device fault is then raised by the kernel launch that caused it (set before CUDA starts)
    os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    from conformance.replay import reproducer_main

    sys.exit(reproducer_main(REPRODUCER, sys.argv[1:]))
