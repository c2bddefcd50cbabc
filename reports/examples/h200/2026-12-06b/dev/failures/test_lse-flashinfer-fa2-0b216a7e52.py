#!/usr/bin/env python3
"""Reproducer: flashinfer-fa2 · lse (crash)

forward: CUDA error: an illegal memory access was encountered

Check:    conformance/spec/test_oracle_checks.py::test_lse[flashinfer-fa2]
Problem:  Problem(seqlens_q=[125, 7], seqlens_k=[125, 7], heads_q=16, heads_kv=2, head_dim=256, dtype='bfloat16', causal='bottom_right', scale=1.0, seed=1862, length_law='bimodal', offsets_dtype='int64', offsets_layout='strided', values='outliers')
          (the failing example)
Recorded: NVIDIA H200 (compute capability 9.0); python 3.12.3; torch 2.11.0, triton 3.6.0, flash-attn-4 4.0.0b36, flashinfer-python 0.7.2.post1, nvidia-cutlass-dsl 4.8.1
          jfa-conformance commit 0781d958d9cf with uncommitted changes

Needs jfa-conformance and the backend's own package installed, nothing from the report directory:
    python test_lse-flashinfer-fa2-0b216a7e52.py                      exit 1: reproduced, 0: passes now, 2: cannot run here
    python test_lse-flashinfer-fa2-0b216a7e52.py --backend reference  the same problem on another backend
    python test_lse-flashinfer-fa2-0b216a7e52.py --device cuda:1      on another device

It reruns the check (test_lse) on the problem as the run did and judges the result against the
float64 oracle.
"""
import os
import sys

REPRODUCER = {'backend': 'flashinfer-fa2',
 'device': 'cuda',
 'check': 'test_lse',
 'params': {},
 'problem': {'seqlens_q': [125, 7],
             'seqlens_k': [125, 7],
             'heads_q': 16,
             'heads_kv': 2,
             'head_dim': 256,
             'head_dim_v': None,
             'dtype': 'bfloat16',
             'causal': 'bottom_right',
             'broadcast_q': False,
             'scale': 1.0,
             'seed': 1862,
             'length_law': 'bimodal',
             'offsets_dtype': 'int64',
             'layout': 'packed',
             'offsets_layout': 'strided',
             'grad_layout': 'contiguous',
             'values': 'outliers'},
 'mode': 'check',
 'gradients': False,
 'nodeid': 'conformance/spec/test_oracle_checks.py::test_lse[flashinfer-fa2]',
 'outcome': 'crash'}

if __name__ == "__main__":
    # a device fault is then raised by the kernel launch that caused it (set before CUDA starts)
    os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    from conformance.replay import reproducer_main

    sys.exit(reproducer_main(REPRODUCER, sys.argv[1:]))
