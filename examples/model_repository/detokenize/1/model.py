"""detokenize: step 3 of chat_ens, executed once per response of `generate` (once per token).

Turns a token id into a word and passes on the running token count, so every streamed event of chat_ens
carries `output_token_count` (exact metering for the gateway, as toy_llm does).
"""

import numpy as np
import triton_python_backend_utils as pb_utils

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "runs", "far", "away")


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            token = int(pb_utils.get_input_tensor_by_name(request, "token_id").as_numpy().reshape(-1)[0])
            index = int(pb_utils.get_input_tensor_by_name(request, "token_index").as_numpy().reshape(-1)[0])
            word = WORDS[token % len(WORDS)] + " "
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("text_output", np.array([word.encode()], dtype=np.object_)),
                pb_utils.Tensor("output_token_count", np.array([index + 1], dtype=np.int32)),
            ]))
        return responses
