"""Chat templates of other model families, to probe the additivity check with (rendered over
the embedded GGUF's vocabulary, or a tokenizer.json's)."""

from __future__ import annotations

# Qwen2.5-Instruct's (and Qwen2.5-Coder's), tools branch left out: ChatML with a default
# system prompt when the first message is not "system", consecutive tool results merged
# into one user turn, and "developer" messages not rendered at all.
QWEN25 = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}"
    "{{- '<|im_start|>user' }}"
    "{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Llama 3's: a BOS on the first message only, contents trimmed, headers that are not
# special tokens in a foreign vocabulary (so they tokenize as text).
LLAMA3 = (
    "{% for message in messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)

# Mistral-Instruct v0.1's: user and assistant must alternate, no other role is accepted.
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}"
)

# Plain text between messages, no special token at any boundary.
PLAIN = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)

# Contents run together: text on both sides of a boundary merges into tokens.
CONCATENATED = "{% for message in messages %}{{ message['content'] }}{% endfor %}"

# ChatML as SmolLM2's, for a tokenizer.json that has no template of its own.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

FOREIGN = {"qwen2.5": QWEN25, "llama3": LLAMA3, "mistral": MISTRAL, "plain": PLAIN,
           "concatenated": CONCATENATED}
