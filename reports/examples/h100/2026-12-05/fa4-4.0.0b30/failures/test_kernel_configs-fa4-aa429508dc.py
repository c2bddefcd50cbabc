#!/usr/bin/env python3
"""Reproducer: fa4 · kernel_configs (fail)

DSLUserCodeError: expects the M-mode to be 64, but got 192

Check:    conformance/spec/test_kernel_configs.py::test_kernel_configs[fa4]
Problem:  Problem(seqlens_q=[5, 0, 17, 1], seqlens_k=[7, 3, 17, 1], heads_q=3, head_dim=192, dtype='float16', causal='bottom_right', scale=0.3, length_law='observed', offsets_dtype='int64')
          (the call in flight when the check's process died: the shapes and options are the ones
          that failed, the input values come from the problem's seed and may differ from the run's)
Recorded: NVIDIA H100 80GB HBM3 (compute capability 9.0); python 3.12.3; torch 2.11.0, triton 3.6.0, flash-attn-4 4.0.0b30, nvidia-cutlass-dsl 4.8.1
          jfa-conformance commit ad9ce0b3f37f

Needs jfa-conformance and the backend's own package installed, nothing from the report directory:
    python test_kernel_configs-fa4-aa429508dc.py                      exit 1: reproduced, 0: passes now, 2: cannot run here
    python test_kernel_configs-fa4-aa429508dc.py --backend reference  the same problem on another backend
    python test_kernel_configs-fa4-aa429508dc.py --device cuda:1      on another device

It calls the backend once on the problem and judges the result against the float64 oracle;
CUDA_LAUNCH_BLOCKING=1 makes a device fault surface at the kernel launch that caused it.
"""
import os
import sys

REPRODUCER = {'backend': 'fa4',
 'device': 'cuda',
 'check': 'test_kernel_configs',
 'params': {},
 'problem': {'seqlens_q': [5, 0, 17, 1],
             'seqlens_k': [7, 3, 17, 1],
             'heads_q': 3,
             'heads_kv': 1,
             'head_dim': 192,
             'head_dim_v': None,
             'dtype': 'float16',
             'causal': 'bottom_right',
             'broadcast_q': False,
             'scale': 0.3,
             'seed': 0,
             'length_law': 'observed',
             'offsets_dtype': 'int64',
             'layout': 'packed',
             'offsets_layout': 'contiguous',
             'grad_layout': 'contiguous',
             'values': 'normal'},
 'mode': 'call',
 'gradients': False,
 'nodeid': 'conformance/spec/test_kernel_configs.py::test_kernel_configs[fa4]',
 'outcome': 'fail'}

if __name__ == "__main__":
    # a device fault is then raised by the kernel launch that caused it (set before CUDA starts)
    os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    from conformance.replay import reproducer_main

    sys.exit(reproducer_main(REPRODUCER, sys.argv[1:]))
