#!/usr/bin/env python3
"""Reproducer: flashinfer-fa2 · guarded_inputs (crash)

forward: CUDA error: an illegal memory access was encountered

Check:    conformance/spec/test_unwritten_memory.py::test_guarded_inputs[flashinfer-fa2]
Problem:  Problem(seqlens_q=[75], seqlens_k=[75], head_dim=128, dtype='float16', causal='none', scale=0.3, seed=134, length_law='equal', layout='row_strided', offsets_layout='strided', values='outliers')
          (the failing example)
Recorded: NVIDIA H100 80GB HBM3 (compute capability 9.0); python 3.12.3; torch 2.11.0, triton 3.6.0, flash-attn-4 4.0.0b36, flashinfer-python 0.7.2.post1, nvidia-cutlass-dsl 4.8.1
          jfa-conformance commit 18b2230e582d with uncommitted changes

Needs jfa-conformance and the backend's own package installed, nothing from the report directory:
    python test_guarded_inputs-flashinfer-fa2-b5cf0fbf8c.py                      exit 1: reproduced, 0: passes now, 2: cannot run here
    python test_guarded_inputs-flashinfer-fa2-b5cf0fbf8c.py --backend reference  the same problem on another backend
    python test_guarded_inputs-flashinfer-fa2-b5cf0fbf8c.py --device cuda:1      on another device

It reruns the check (test_guarded_inputs) on the problem as the run did and judges the result
against the float64 oracle.
"""
import os
import sys

REPRODUCER = {'backend': 'flashinfer-fa2',
 'device': 'cuda',
 'check': 'test_guarded_inputs',
 'params': {},
 'problem': {'seqlens_q': [75],
             'seqlens_k': [75],
             'heads_q': 1,
             'heads_kv': 1,
             'head_dim': 128,
             'head_dim_v': None,
             'dtype': 'float16',
             'causal': 'none',
             'broadcast_q': False,
             'scale': 0.3,
             'seed': 134,
             'length_law': 'equal',
             'offsets_dtype': 'int32',
             'layout': 'row_strided',
             'offsets_layout': 'strided',
             'grad_layout': 'contiguous',
             'values': 'outliers'},
 'mode': 'check',
 'gradients': False,
 'nodeid': 'conformance/spec/test_unwritten_memory.py::test_guarded_inputs[flashinfer-fa2]',
 'outcome': 'crash'}

if __name__ == "__main__":
    # a device fault is then raised by the kernel launch that caused it (set before CUDA starts)
    os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    from conformance.replay import reproducer_main

    sys.exit(reproducer_main(REPRODUCER, sys.argv[1:]))
