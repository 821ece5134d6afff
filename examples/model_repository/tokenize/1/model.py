"""tokenize: step 1 of chat_ens. A stand-in tokenizer (one id per UTF-8 byte); not a real tokenizer."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            data = text if isinstance(text, bytes) else str(text).encode()
            ids = np.frombuffer(data or b" ", dtype=np.uint8).astype(np.int32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("input_ids", ids)]))
        return responses
