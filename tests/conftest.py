"""Test set-up shared by every test folder.

Kernels: on a machine without a GPU, Triton kernels run under the interpreter (TRITON_INTERPRET=1), which must be
set before any kernel module is imported, hence here.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
