"""Harness-only workaround for a vLLM bug on hosts without an accelerator,
loaded (as sitecustomize) into the vLLM processes the e2e suite starts.

vLLM's MooncakeConnector calls torch.accelerator.current_device_index() while
registering its KV caches. With PyPI's torch (a CUDA build) on a host without
a GPU that raises "Found no NVIDIA driver", although vLLM's CPU worker runs
everything else on the CPU. vLLM is at fault, not the transfer engine; we do
not patch vLLM. On a CPU-only host the only device index is 0, so the call
answers 0 there, exactly what a CPU build of torch answers. Hosts with an
accelerator are left alone. Our own connector (connectors/vllm) does not make
this call.
"""

import os

if os.environ.get("MOONCAKE_E2E_CPU_WORKAROUND") == "1":
    import torch

    if not torch.cuda.is_available():
        torch.accelerator.current_device_index = lambda: 0
