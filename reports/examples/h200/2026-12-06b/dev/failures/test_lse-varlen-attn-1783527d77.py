#!/usr/bin/env python3
"""Reproducer: varlen-attn · lse (crash)

forward: CUDA error: invalid argument

Check:    conformance/spec/test_oracle_checks.py::test_lse[varlen-attn]
Problem:  Problem(seqlens_q=[0, 0], seqlens_k=[113, 84], head_dim=256, dtype='bfloat16', causal='none', scale=0.3, length_law='observed')
          (the call in flight when the check's process died: the shapes and options are the ones
          that failed, the input values come from the problem's seed and may differ from the run's)
Recorded: NVIDIA H200 (compute capability 9.0); python 3.12.3; torch 2.11.0, triton 3.6.0, flash-attn-4 4.0.0b36, flashinfer-python 0.7.2.post1, nvidia-cutlass-dsl 4.8.1
          jfa-conformance commit 0781d958d9cf with uncommitted changes

Needs jfa-conformance and the backend's own package installed, nothing from the report directory:
    python test_lse-varlen-attn-1783527d77.py                      exit 1: reproduced, 0: passes now, 2: cannot run here
    python test_lse-varlen-attn-1783527d77.py --backend reference  the same problem on another backend
    python test_lse-varlen-attn-1783527d77.py --device cuda:1      on another device

It calls the backend once on the problem and judges the result against the float64 oracle;
CUDA_LAUNCH_BLOCKING=1 makes a device fault surface at the kernel launch that caused it.
"""
import os
import sys

REPRODUCER = {'backend': 'varlen-attn',
 'device': 'cuda',
 'check': 'test_lse',
 'params': {},
 'problem': {'seqlens_q': [0, 0],
             'seqlens_k': [113, 84],
             'heads_q': 1,
             'heads_kv': 1,
             'head_dim': 256,
             'head_dim_v': None,
             'dtype': 'bfloat16',
             'causal': 'none',
             'broadcast_q': False,
             'scale': 0.3,
             'seed': 0,
             'length_law': 'observed',
             'offsets_dtype': 'int32',
             'layout': 'packed',
             'offsets_layout': 'contiguous',
             'grad_layout': 'contiguous',
             'values': 'normal'},
 'mode': 'call',
 'gradients': False,
 'nodeid': 'conformance/spec/test_oracle_checks.py::test_lse[varlen-attn]',
 'outcome': 'crash'}

if __name__ == "__main__":
    # a device fault is then raised by the kernel launch that caused it (set before CUDA starts)
    os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    from conformance.replay import reproducer_main

    sys.exit(reproducer_main(REPRODUCER, sys.argv[1:]))
