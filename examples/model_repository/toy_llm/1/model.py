"""toy_llm: a stand-in for an LLM with controllable latency and faults. It is not a language model.

Decoupled (streaming) Python backend model. For each request it streams `max_tokens` responses, one token
each, after `first_token_delay_ms` for the first and `token_delay_ms` between the others. Every response also
carries `output_token_count`, the exact number of tokens produced so far, so a gateway can meter exactly.
With `fail` (probability 0..1) the stream ends with an error after about half its tokens, the way a real
server fails mid-generation. Each knob may be an input (top-level key of a generate body) or a request
parameter. A cancelled request (client gone) stops producing tokens.
"""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

DEFAULTS = {"max_tokens": 16, "first_token_delay_ms": 20, "token_delay_ms": 5, "fail": 0.0}
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "runs", "far", "away")


class TritonPythonModel:
    def initialize(self, args):
        self.rng = np.random.default_rng()
        self.inflight = 0
        self.lock = threading.Lock()

    def execute(self, requests):
        # Decoupled: answer through response senders from threads so one slow stream never blocks others.
        for request in requests:
            knobs = _knobs(request)
            sender = request.get_response_sender()
            fail_at = None
            if knobs["fail"] > 0 and self.rng.random() < knobs["fail"]:
                fail_at = max(1, int(knobs["max_tokens"]) // 2)
            thread = threading.Thread(target=self._stream, args=(sender, knobs, fail_at), daemon=True)
            thread.start()
        return None

    def _stream(self, sender, knobs, fail_at):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        max_tokens = max(0, int(knobs["max_tokens"]))
        time.sleep(max(0, knobs["first_token_delay_ms"]) / 1000.0)
        for i in range(max_tokens):
            if i > 0:
                time.sleep(max(0, knobs["token_delay_ms"]) / 1000.0)
            if sender.is_cancelled():
                # Close the request: without a final flag Triton counts it in flight and waits for it
                # (up to --exit-timeout-secs) when shutting down.
                sender.send(flags=final)
                return
            if fail_at is not None and i == fail_at:
                sender.send(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("injected failure mid-stream (fail)")), flags=final)
                return
            word = WORDS[i % len(WORDS)] + " "
            response = pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("text_output", np.array([word.encode()], dtype=np.object_)),
                pb_utils.Tensor("output_token_count", np.array([i + 1], dtype=np.int32)),
            ])
            sender.send(response, flags=final if i == max_tokens - 1 else 0)
        if max_tokens == 0:
            sender.send(flags=final)


def _knobs(request):
    knobs = dict(DEFAULTS)
    try:
        params = json.loads(request.parameters() or "{}")
    except ValueError:
        params = {}
    for name in DEFAULTS:
        if name in params:
            knobs[name] = float(params[name])
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is not None:
            knobs[name] = float(tensor.as_numpy().reshape(-1)[0])
    return knobs
