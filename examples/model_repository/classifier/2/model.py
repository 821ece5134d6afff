"""classifier, version 2 (a retrained candidate for canaries): a fixed linear layer + softmax over 16 features -> 4
classes (numpy only).

A classic batched model for the L2 layer. A request may carry the parameter `fail` (probability 0..1) to make
the model fail that share of requests; the demo and tests use it to inject faults.

A drawn failure raises from `execute`, failing the whole batch it was scheduled in: Triton 2.51 counts a
per-request error response from the Python backend as a *success* in `nv_inference_request_failure`/`_success`,
while an exception is counted as a failure with reason BACKEND, which is what a real crashing model shows.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

SEED = 2
CLASSES = 4


class TritonPythonModel:
    def initialize(self, args):
        rng = np.random.default_rng(SEED)
        self.weights = rng.standard_normal((16, CLASSES)).astype(np.float32)
        self.rng = np.random.default_rng()

    def execute(self, requests):
        for request in requests:
            fail = _float_param(request, "fail")
            if fail > 0 and self.rng.random() < fail:
                raise pb_utils.TritonModelException("injected failure (request parameter fail)")
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().astype(np.float32)
            logits = x @ self.weights
            logits -= logits.max(axis=1, keepdims=True)
            probs = np.exp(logits)
            probs /= probs.sum(axis=1, keepdims=True)
            label = probs.argmax(axis=1).astype(np.int32).reshape(-1, 1)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("PROBABILITIES", probs.astype(np.float32)),
                pb_utils.Tensor("LABEL", label),
            ]))
        return responses


def _float_param(request, name):
    try:
        value = json.loads(request.parameters() or "{}").get(name, 0)
        return float(value)
    except (TypeError, ValueError):
        return 0.0
