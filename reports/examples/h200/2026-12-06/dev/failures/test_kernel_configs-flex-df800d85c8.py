#!/usr/bin/env python3
"""Reproducer: flex · kernel_configs (fail)

InductorError: RuntimeError: No valid triton configs. OutOfMemoryError: out of resource:
triton_tem_fused_flex_attention_0 Required: 345344 Hardware limit:232448 Reducing block sizes or
`num_stages` may help.

Check:    conformance/spec/test_kernel_configs.py::test_kernel_configs[flex]
Problem:  Problem(seqlens_q=[5, 5, 5, 5], seqlens_k=[7, 3, 17, 1], heads_q=16, heads_kv=2, head_dim=192, dtype='float32', causal='top_left', scale=1.0, length_law='observed', offsets_dtype='int64')
          (the call in flight when the check's process died: the shapes and options are the ones
          that failed, the input values come from the problem's seed and may differ from the run's)
Recorded: NVIDIA H200 (compute capability 9.0); python 3.12.3; torch 2.11.0, triton 3.6.0, flash-attn-4 4.0.0b36, flashinfer-python 0.7.2.post1, nvidia-cutlass-dsl 4.8.1
          jfa-conformance commit ba8bbe1ade69

Needs jfa-conformance and the backend's own package installed, nothing from the report directory:
    python test_kernel_configs-flex-df800d85c8.py                      exit 1: reproduced, 0: passes now, 2: cannot run here
    python test_kernel_configs-flex-df800d85c8.py --backend reference  the same problem on another backend
    python test_kernel_configs-flex-df800d85c8.py --device cuda:1      on another device

It calls the backend once on the problem and judges the result against the float64 oracle;
CUDA_LAUNCH_BLOCKING=1 makes a device fault surface at the kernel launch that caused it.
"""
import os
import sys

REPRODUCER = {'backend': 'flex',
 'device': 'cuda',
 'check': 'test_kernel_configs',
 'params': {},
 'problem': {'seqlens_q': [5, 5, 5, 5],
             'seqlens_k': [7, 3, 17, 1],
             'heads_q': 16,
             'heads_kv': 2,
             'head_dim': 192,
             'head_dim_v': None,
             'dtype': 'float32',
             'causal': 'top_left',
             'broadcast_q': False,
             'scale': 1.0,
             'seed': 0,
             'length_law': 'observed',
             'offsets_dtype': 'int64',
             'layout': 'packed',
             'offsets_layout': 'contiguous',
             'grad_layout': 'contiguous',
             'values': 'normal'},
 'mode': 'call',
 'gradients': False,
 'nodeid': 'conformance/spec/test_kernel_configs.py::test_kernel_configs[flex]',
 'outcome': 'fail'}

if __name__ == "__main__":
    # a device fault is then raised by the kernel launch that caused it (set before CUDA starts)
    os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    from conformance.replay import reproducer_main

    sys.exit(reproducer_main(REPRODUCER, sys.argv[1:]))
