"""Each API's bytes as its servers write them, for the gateway dialect tests (test_gateway_dialects.py).

Shapes from the APIs' own references: OpenAI Chat Completions streaming (chunks, `stream_options.include_usage`
final chunk with empty `choices`, `data: [DONE]`); OpenAI Responses streaming events (`event: <type>` lines,
`sequence_number`, terminal `response.completed` / `response.incomplete` / `response.failed`, `error` events
`{"type", "code", "message", "param"}`, no `[DONE]`); Anthropic Messages streaming (`message_start` with input
usage, `content_block_delta` of `text_delta` / `thinking_delta` / `input_json_delta` / `signature_delta`,
`message_delta` with cumulative `usage.output_tokens`, `message_stop`, `ping`, `error` with a nested error);
embeddings answers with `usage.prompt_tokens`.
"""

from __future__ import annotations

import json

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
EMBEDDINGS = "/v1/embeddings"


def data(doc: dict) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def named(kind: str, doc: dict) -> bytes:
    """An event with its `event:` line, as the Responses and Messages APIs send every event."""
    return b"event: " + kind.encode() + b"\n" + data({"type": kind, **doc})


# ------------------------------------------------------------------------------------------- chat
def chat(delta: dict | None = None, finish=None, index: int = 0, **extra) -> bytes:
    return data({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-test",
                 "choices": [{"index": index, "delta": delta or {}, "logprobs": extra.pop("logprobs", None),
                              "finish_reason": finish}], **extra})


def chat_usage(prompt: int, completion: int) -> bytes:
    return data({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-test",
                 "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                          "total_tokens": prompt + completion}})


DONE = b"data: [DONE]\n\n"
CHAT_TOKENS = [chat({"role": "assistant", "content": ""}), chat({"reasoning_content": "Let me see"}),
               chat({"content": "Hello"}), chat({"content": " there"})]
CHAT_END = [chat({}, finish="stop"), chat_usage(9, 12)]
CHAT_MARKER = DONE
CHAT_ERROR = data({"object": "error", "message": "engine died", "type": "InternalServerError", "param": None,
                   "code": 500})


# -------------------------------------------------------------------------------------- responses
def _response(status: str, usage: dict | None, error: dict | None = None) -> dict:
    return {"id": "resp_1", "object": "response", "created_at": 1, "status": status, "model": "gpt-test",
            "output": [], "usage": usage, "error": error}


RESPONSES_USAGE = {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 12,
                   "output_tokens_details": {"reasoning_tokens": 4}, "total_tokens": 21}
RESPONSES_TOKENS = [
    named("response.created", {"sequence_number": 0, "response": _response("in_progress", None)}),
    named("response.in_progress", {"sequence_number": 1, "response": _response("in_progress", None)}),
    named("response.output_item.added", {"sequence_number": 2, "output_index": 0,
                                         "item": {"id": "rs_1", "type": "reasoning", "summary": []}}),
    named("response.reasoning_text.delta", {"sequence_number": 3, "item_id": "rs_1", "output_index": 0,
                                            "content_index": 0, "delta": "Let me see"}),
    named("response.output_item.added", {"sequence_number": 4, "output_index": 1,
                                         "item": {"id": "msg_1", "type": "message", "role": "assistant",
                                                  "status": "in_progress", "content": []}}),
    named("response.content_part.added", {"sequence_number": 5, "item_id": "msg_1", "output_index": 1,
                                          "content_index": 0,
                                          "part": {"type": "output_text", "text": "", "annotations": []}}),
    named("response.output_text.delta", {"sequence_number": 6, "item_id": "msg_1", "output_index": 1,
                                         "content_index": 0, "delta": "Hello", "logprobs": []}),
    named("response.output_text.delta", {"sequence_number": 7, "item_id": "msg_1", "output_index": 1,
                                         "content_index": 0, "delta": " there", "logprobs": []}),
]
RESPONSES_END = [
    named("response.output_text.done", {"sequence_number": 8, "item_id": "msg_1", "output_index": 1,
                                        "content_index": 0, "text": "Hello there", "logprobs": []}),
]
RESPONSES_MARKER = named("response.completed", {"sequence_number": 9,
                                                "response": _response("completed", RESPONSES_USAGE)})
RESPONSES_ERROR = named("error", {"code": "server_error", "message": "The server had an error", "param": None,
                                  "sequence_number": 8})
RESPONSES_FAILED = named("response.failed", {"sequence_number": 8, "response": _response(
    "failed", None, {"code": "server_error", "message": "The model failed"})})
RESPONSES_INCOMPLETE = named("response.incomplete", {"sequence_number": 9, "response": {
    **_response("incomplete", RESPONSES_USAGE), "incomplete_details": {"reason": "max_output_tokens"}}})


# --------------------------------------------------------------------------------------- messages
MESSAGES_TOKENS = [
    named("message_start", {"message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                                        "model": "claude-test", "stop_reason": None, "stop_sequence": None,
                                        "usage": {"input_tokens": 7, "cache_creation_input_tokens": 0,
                                                  "cache_read_input_tokens": 2, "output_tokens": 1}}}),
    named("content_block_start", {"index": 0, "content_block": {"type": "thinking", "thinking": "",
                                                                 "signature": ""}}),
    named("ping", {}),
    named("content_block_delta", {"index": 0, "delta": {"type": "thinking_delta", "thinking": "Let me see"}}),
    named("content_block_delta", {"index": 0, "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM"}}),
    named("content_block_stop", {"index": 0}),
    named("content_block_start", {"index": 1, "content_block": {"type": "text", "text": ""}}),
    named("content_block_delta", {"index": 1, "delta": {"type": "text_delta", "text": "Hello"}}),
    named("content_block_stop", {"index": 1}),
    named("content_block_start", {"index": 2, "content_block": {"type": "tool_use", "id": "toolu_1",
                                                                 "name": "get_weather", "input": {}}}),
    named("content_block_delta", {"index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"city\":"}}),
]
MESSAGES_END = [
    named("content_block_stop", {"index": 2}),
    named("message_delta", {"delta": {"stop_reason": "tool_use", "stop_sequence": None},
                            "usage": {"output_tokens": 12}}),
]
MESSAGES_MARKER = named("message_stop", {})
MESSAGES_ERROR = named("error", {"error": {"type": "overloaded_error", "message": "Overloaded"}})

# Per API: path, events carrying output, events after them, the end marker, a mid-stream error event,
# (input, output) the server's usage says, output events counted without it, what the error keeps
# (code label, error_code, error_type).
APIS = {
    "chat": (CHAT, CHAT_TOKENS, CHAT_END, CHAT_MARKER, CHAT_ERROR, (9, 12), 3,
             ("500", 500, "InternalServerError")),
    "responses": (RESPONSES, RESPONSES_TOKENS, RESPONSES_END, RESPONSES_MARKER, RESPONSES_ERROR, (9, 12), 3,
                  ("other", "server_error", None)),
    "messages": (MESSAGES, MESSAGES_TOKENS, MESSAGES_END, MESSAGES_MARKER, MESSAGES_ERROR, (9, 12), 3,
                 ("200", None, "overloaded_error")),
}
