#!/usr/bin/env python3
"""Reproducer: fa4 · edge_case:gqa_ratio_3 · bfloat16 (fail)

disagrees with the float64 oracle: dq 13x, dk 8.5x, dv 27x the allowance

Check:    conformance/spec/test_edge_cases.py::test_edge_case[fa4-gqa_ratio_3-bfloat16]
Problem:  Problem(seqlens_q=[17, 4], seqlens_k=[17, 4], heads_q=6, heads_kv=2, head_dim=40, dtype='bfloat16', causal='bottom_right')
          (the failing example)
Recorded: NVIDIA H200 (compute capability 9.0); python 3.12.3; torch 2.11.0, triton 3.6.0, flash-attn-4 4.0.0b36, flashinfer-python 0.7.2.post1, nvidia-cutlass-dsl 4.8.1
          jfa-conformance commit 0781d958d9cf with uncommitted changes

Needs jfa-conformance and the backend's own package installed, nothing from the report directory:
    python test_edge_case-fa4-c9a8e34525.py                      exit 1: reproduced, 0: passes now, 2: cannot run here
    python test_edge_case-fa4-c9a8e34525.py --backend reference  the same problem on another backend
    python test_edge_case-fa4-c9a8e34525.py --device cuda:1      on another device

It reruns the check (test_edge_case) on the problem as the run did and judges the result against the
float64 oracle.
"""
import os
import sys

REPRODUCER = {'backend': 'fa4',
 'device': 'cuda',
 'check': 'test_edge_case',
 'params': {'case': 'gqa_ratio_3', 'dtype': 'bfloat16'},
 'problem': {'seqlens_q': [17, 4],
             'seqlens_k': [17, 4],
             'heads_q': 6,
             'heads_kv': 2,
             'head_dim': 40,
             'head_dim_v': None,
             'dtype': 'bfloat16',
             'causal': 'bottom_right',
             'broadcast_q': False,
             'scale': None,
             'seed': 0,
             'length_law': 'given',
             'offsets_dtype': 'int32',
             'layout': 'packed',
             'offsets_layout': 'contiguous',
             'grad_layout': 'contiguous',
             'values': 'normal'},
 'mode': 'check',
 'gradients': False,
 'nodeid': 'conformance/spec/test_edge_cases.py::test_edge_case[fa4-gqa_ratio_3-bfloat16]',
 'outcome': 'fail'}

if __name__ == "__main__":
    # a device fault is then raised by the kernel launch that caused it (set before CUDA starts)
    os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    from conformance.replay import reproducer_main

    sys.exit(reproducer_main(REPRODUCER, sys.argv[1:]))
