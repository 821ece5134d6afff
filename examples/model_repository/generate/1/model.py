"""generate: step 2 of chat_ens, a decoupled stand-in for an LLM's generation loop (not a language model).

For each request it streams `max_tokens` responses, one token each (`token_id`, `token_index`), after
`first_token_delay_ms` for the first and `token_delay_ms` between the others. With `fail` (probability 0..1)
the stream ends with an error response after about half its tokens, the way a real server fails
mid-generation. The knobs come from the request's parameters (the ensemble passes the client's `parameters`
on). A cancelled request (client gone) stops producing tokens.
"""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

DEFAULTS = {"first_token_delay_ms": 20, "token_delay_ms": 5, "fail": 0.0}


class TritonPythonModel:
    def initialize(self, args):
        self.rng = np.random.default_rng()

    def execute(self, requests):
        for request in requests:
            knobs = _knobs(request)
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy().reshape(-1)
            max_tokens = int(pb_utils.get_input_tensor_by_name(request, "max_tokens").as_numpy().reshape(-1)[0])
            fail_at = None
            if knobs["fail"] > 0 and self.rng.random() < knobs["fail"]:
                fail_at = max(1, max_tokens // 2)
            sender = request.get_response_sender()
            seed = int(ids.sum()) if ids.size else 0
            threading.Thread(target=self._stream, args=(sender, seed, max(0, max_tokens), knobs, fail_at),
                             daemon=True).start()
        return None

    def _stream(self, sender, seed, max_tokens, knobs, fail_at):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        time.sleep(max(0, knobs["first_token_delay_ms"]) / 1000.0)
        for i in range(max_tokens):
            if i > 0:
                time.sleep(max(0, knobs["token_delay_ms"]) / 1000.0)
            if sender.is_cancelled():
                sender.send(flags=final)  # close the request so Triton does not wait for it at shutdown
                return
            if fail_at is not None and i == fail_at:
                sender.send(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("injected failure mid-stream (fail)")), flags=final)
                return
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("token_id", np.array([seed + i], dtype=np.int32)),
                pb_utils.Tensor("token_index", np.array([i], dtype=np.int32)),
            ]))
        sender.send(flags=final)


def _knobs(request):
    try:
        params = json.loads(request.parameters() or "{}")
    except ValueError:
        params = {}
    return {name: float(params.get(name, default)) for name, default in DEFAULTS.items()}
