#!/usr/bin/env python3
"""Writes cases.json: small templates rendered by jinja2 in the environment
of transformers' apply_chat_template (trim_blocks, lstrip_blocks, loop
controls, tojson, raise_exception, namespace). Run from this directory:

    python3 cases.py > cases.json

Needs transformers and jinja2 (no torch).
"""
import json
import sys

from transformers.utils.chat_template_utils import _compile_jinja_template

M = [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi there"},
     {"role": "assistant", "content": "Hello!", "tool_calls": [{"function": {"name": "f", "arguments": {"b": 2, "a": [1, 2.5, None, True, "x"]}}}]},
     {"role": "tool", "content": "ok"}]
V = {"messages": M, "s": "  Hello, World  ", "n": 7, "f": 2.5, "big": 1e16, "small": 0.0001, "tiny": 1e-05,
     "l": [3, 1, 2], "d": {"z": 1, "a": {"k": "v"}, "m": [1, "two"]}, "t": True, "none": None, "u8": "é東😀\n\"'\\"}

CASES = [
    # whitespace control with trim_blocks / lstrip_blocks
    "{% if t %}\n  yes\n{% endif %}\nend",
    "  {% if t %}x{% endif %}  \n  {{ n }}\n",
    "{% for i in l %}\n    {{ i }}\n{% endfor %}\n",
    "a {%- if t %} b {% endif -%} c",
    "{{- 'x' -}}   \n\n  {{- 'y' }}",
    "{# comment #}\n  {#- c2 -#}  z",
    "line\n    {% if t %}in{% endif %}\n",
    "{{ n }}  {% if t %}same line{% endif %}\n",
    "{%+ if t %}keep{% endif %}",
    "x\r\ny\rz\n",
    # printing values as Python does
    "{{ none }} {{ t }} {{ n }} {{ f }} {{ big }} {{ small }} {{ tiny }} {{ l }} {{ d }} {{ undefined_thing }}|",
    "{{ [1, 'a', none, true, 1.0] }} {{ (1,) }} {{ (1, 2) }} {{ {'a': [1]} }} {{ u8 }} {{ [u8] }}",
    "{{ 1 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 10 / 5 }} {{ 3 * 'ab' }} {{ 1 + 2.0 }} {{ true + 1 }}",
    "{{ 'a' ~ 1 ~ none ~ undefined_thing }} {{ 'x' + 'y' }} {{ l + [4] }}",
    # tojson
    "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ l | tojson(indent=4) }}|{{ u8 | tojson }}|{{ d | tojson(sort_keys=true) }}",
    "{{ messages[2].tool_calls[0].function.arguments | tojson }} {{ {} | tojson }} {{ [] | tojson(indent=2) }} {{ f | tojson }} {{ none | tojson }}",
    "{{ d | tojson(separators=(',', ':')) }} {{ 'é' | tojson(ensure_ascii=true) }} {{ '😀' | tojson(ensure_ascii=true) }} {{ big | tojson }}",
    # strings
    "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' H') }}|{{ s | trim }}|{{ s.upper() }}|{{ s.lower() }}|{{ s.title() }}",
    "{{ s.split() }} {{ s.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ ' a b  c '.split(none, 1) }}",
    "{{ s.startswith('  He') }} {{ s.endswith(('x', '  ')) }} {{ s.replace('l', 'L') }} {{ s.replace('l', 'L', 1) }} {{ s.find('o') }} {{ s.count('l') }}",
    "{{ '-'.join(['a', 'b']) }} {{ 'abc'[1] }} {{ 'abc'[-1] }} {{ 'abcdef'[1:4] }} {{ 'abcdef'[::-1] }} {{ 'abcdef'[::2] }} {{ u8[1:3] }}",
    "{{ 'hello world'.capitalize() }} {{ 'hello-world foo' | title }} {{ 'ab' | upper }} {{ 'x' in 'xyz' }} {{ 'q' not in 'xyz' }}",
    # case mapping as Python's: full mappings, final sigma, title and capitalize
    "{{ 'straße ﬁne İstanbul ŉ ǰ'.upper() }}|{{ 'İSTANBUL ΣΑΣ ΟΔΟΣ. ΣΑ\u0301Σ Σ ₕΣ'.lower() }}|{{ \"ß ﬁne ǆemal they're ΣΑΣ ΣΑ'Σ\".title() }}|{{ 'ßΣA'.capitalize() }} {{ 'ǆΣ'.capitalize() }} {{ 'ₕΣ'.capitalize() }}",
    "{{ 'straße ﬁ' | upper }}|{{ 'ΣΑΣ İ' | lower }}|{{ 'ß-ǆ (ﬁne) ΑΣ' | title }}|{{ 'ßx' | capitalize }}|{{ ['b', 'A', 'ä', 'Ä'] | sort | join }}|{{ ['Straße', 'STRASSE', 'a', 'A'] | unique | join(',') }}",
    "{{ 'abc' is lower }} {{ 'a1' is lower }} {{ '12' is lower }} {{ '' is lower }} {{ 'ABC' is upper }} {{ 'ǅ' is upper }} {{ 'ª' is lower }} {{ 5 is lower }} {{ ['a'] is lower }} {{ 'Ⓐ' is upper }}",
    "[{{ '\x1c a \x1f'.strip() }}] {{ 'a\x1db c'.split() | length }} {{ 'a\x1eb' | title }} {{ 'x½y ²z Ⅻ_w é́' | wordcount }}",
    "{{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ 'Ab'.islower() }} {{ 'a\\nb'.splitlines() }}",
    # lists, dicts, slicing
    "{{ l[0] }} {{ l[-1] }} {{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[5] }}| {{ l | length }} {{ l | first }} {{ l | last }} {{ l | sort }} {{ l | sort(reverse=true) }}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {{ d.keys() | list }} {{ d.get('z') }} {{ d.get('q', 'dflt') }} {{ d['a']['k'] }} {{ d.a.k }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ messages | map(attribute='role') | join(',') }} {{ messages | rejectattr('role', 'eq', 'tool') | map(attribute='role') | list }}",
    "{{ l | select('odd') | list }} {{ l | reject('even') | list }} {{ l | map('string') | join('') }} {{ [1, 1, 'A', 'a'] | unique | list }} {{ l | reverse | list }}",
    "{{ d | items | list }} {{ 'x' | list }} {{ d | list }} {{ d | length }} {{ 'abc' | length }} {{ undefined_thing | length }}",
    "{{ undefined_thing | default('dv') }} {{ '' | default('dv') }} {{ '' | default('dv', true) }} {{ none | default('dv') }}",
    "{{ '42' | int }} {{ 'x' | int }} {{ 3.9 | int }} {{ '2.5' | float }} {{ -3 | abs }} {{ 'a b c' | wordcount }} {{ 'a\\nb' | indent(2) }} {{ 'a\\nb' | indent(2, true) }}",
    # tests
    "{{ n is number }} {{ n is integer }} {{ f is float }} {{ s is string }} {{ d is mapping }} {{ l is iterable }} {{ s is iterable }} {{ undefined_thing is defined }} {{ none is none }} {{ t is boolean }}",
    "{{ n is odd }} {{ n is even }} {{ n is divisibleby 7 }} {{ n is divisibleby(2) }} {{ 'ab' is lower }} {{ l is sequence }} {{ n is eq 7 }} {{ n is not ne 7 }} {{ 3 is in l }}",
    # control flow, loops, namespace, macros
    "{% for m in messages %}{{ loop.index }}/{{ loop.length }}:{{ loop.first }}{{ loop.last }}{{ loop.revindex0 }} {% endfor %}",
    "{% for m in messages if m.role != 'tool' %}{{ m.role }}{% if not loop.last %},{% endif %}{% endfor %}",
    "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for x in [] %}no{% else %}empty{% endfor %} {% for i in range(1, 10, 3) %}{{ i }}{% endfor %} {% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %}",
    "{% set ns = namespace(c=0, s='') %}{% for m in messages %}{% set ns.c = ns.c + 1 %}{% set ns.s = ns.s ~ m.role[0] %}{% endfor %}{{ ns.c }} {{ ns.s }}",
    "{% set x = 1 %}{% for i in l %}{% set x = i %}{% endfor %}{{ x }} {% set a, b = 1, 2 %}{{ a }}{{ b }}",
    "{% set blk %}inner {{ n }}{% endset %}[{{ blk }}]",
    "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', greeting='Hi') }} {{ greet(name='Cy') }}",
    "{% if n > 5 and not t == false or none %}a{% elif n %}b{% else %}c{% endif %} {{ 'y' if t else 'n' }} {{ 'y' if none }}|",
    "{{ messages[0]['role'] }} {{ messages[0].content | trim }} {{ messages[-1].role }} {{ messages[1:] | length }} {{ messages[2].tool_calls is defined }} {{ messages[0].tool_calls is defined }}",
    "{{ messages[0].content.content is defined }} {{ none.x is defined }} {{ messages[9] is defined }} {{ (messages | last).role }}",
    "{{ messages[0] == messages[0] }} {{ messages[0] == messages[1] }} {{ [1, 2] == [1, 2] }} {{ 1 == 1.0 }} {{ 1 == true }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }}",
    # chained comparisons hold when each holds, each operand evaluated once
    "{{ 3 > 2 == 2 }} {{ 1 != 2 != 1 }} {{ 1 < n < 10 }} {{ 1 < n > 10 }} {{ 0 <= 0 <= 0 < 1 }} {{ 'a' in 'abc' in ['abc'] }} {{ 2 not in l == false }} {{ (3 > 2) == 2 }}",
    "{% if 0 < n <= 7 %}in{% else %}out{% endif %} {{ 1 < none < 2 if false else 'short' }} {{ 5 > 9 < undefined_thing }}",
    "{{ dict(a=1, b='x') }} {{ namespace(a=1).a }} {{ {'k': 1}.items() | list }}",
    "{% generation %}gen {{ n }}{% endgeneration %}",
    # errors
    "{{ raise_exception('custom failure') }}",
    "{{ undefined_thing.attr }}",
    "{{ 'a' + 1 }}",
    "{{ l.append(4) }}",
    "{{ none | length }}",
    "{% for x in n %}{% endfor %}",
    "{{ 1 / 0 }}",
    # huge operands: jinja2 answers at once, or fails
    "{{ 1 ** 1000000000000 }} {{ (-1) ** 1000000000001 }} {{ 2 ** 62 }} {{ 'abc'[1::9223372036854775807] }} {{ 'abc'[::-9223372036854775807] }} {{ [1, 2, 3][1::9223372036854775807] }} {{ ([] * 4611686018427387904) | length }}",
    "{{ 'abcd' * 4611686018427387904 }}",
    # scoping
    "{% for i in [1,2] %}{% if i == 1 %}{% set y = 5 %}{% endif %}[{{ y }}]{% endfor %}",
    "{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}",
    "{% set v = 1 %}{% macro m() %}{{ v }}{% endmacro %}{% set v = 3 %}{{ m() }}",
    "{% for i in [1] %}{% set v = 9 %}{% macro m() %}{{ v }}{% endmacro %}{{ m() }}{% endfor %}",
]

QWEN3_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

# Hermes-style tool prompt: a recursive macro over JSON schemas.
HERMES_TEMPLATE = r"""{%- macro json_to_python_type(json_spec) %}
{%- set basic_type_map = {"string": "str", "number": "float", "integer": "int", "boolean": "bool", "null": "None"} %}
{%- if basic_type_map[json_spec.type] is defined %}
    {{- basic_type_map[json_spec.type] }}
{%- elif json_spec.type == "array" %}
    {{- "list[" +  json_to_python_type(json_spec["items"]) + "]" }}
{%- elif json_spec.type == "object" %}
    {%- if json_spec.additionalProperties is defined %}
        {{- "dict[str, " + json_to_python_type(json_spec.additionalProperties) + ']' }}
    {%- else %}
        {{- "dict" }}
    {%- endif %}
{%- elif json_spec.type is iterable %}
    {{- "Union[" }}
    {%- for t in json_spec.type %}
        {{- json_to_python_type({"type": t}) }}
        {%- if not loop.last %}
            {{- "," }}
        {%- endif %}
    {%- endfor %}
    {{- "]" }}
{%- else %}
    {{- "Any" }}
{%- endif %}
{%- endmacro %}
{%- for tool in tools %}
    {%- set tool = tool.function %}
    {{- "def " + tool.name + "(" }}
    {%- for param_name, param_fields in tool.parameters.properties|items %}
        {{- param_name + ": " + json_to_python_type(param_fields) }}
        {%- if not loop.last %}
            {{- ", " }}
        {%- endif %}
    {%- endfor %}
    {{- "):\n    \"\"\"" + tool.description + "\n\n    Args:\n" }}
    {%- for param_name, param_fields in tool.parameters.properties|items %}
        {%- if param_fields.description is defined %}
        {{- "        " + param_name + "(" + json_to_python_type(param_fields) + "): " + param_fields.description|trim + "\n" }}
        {%- endif %}
    {%- endfor %}
    {{- "    \"\"\"\n" }}
{%- endfor %}
{%- for message in messages %}
    {{- '<|im_start|>' + message.role + '\n' + (message.content or '') | trim + '<|im_end|>\n' }}
{%- endfor %}"""

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather — now.",
          "parameters": {"type": "object", "properties": {
              "city": {"type": "string", "description": " City name "},
              "days": {"type": "integer"},
              "tags": {"type": "array", "items": {"type": "string"}, "description": "Tags"},
              "opts": {"type": "object", "additionalProperties": {"type": ["number", "null"]}}},
              "required": ["city"]}}}]

# DeepSeek-style: namespace flags, tool calls with string arguments, the
# reasoning stripped from earlier answers, full-width special tokens.
DEEPSEEK_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(is_first=false, is_tool=false, system_prompt='') %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = ns.system_prompt + message['content'] %}{%- endif %}{%- endfor %}"
    "{{ bos_token }}{{ ns.system_prompt }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{ '<\uff5cUser\uff5c>' + message['content'] }}"
    "{%- elif message['role'] == 'assistant' and message['content'] is none %}{%- set ns.is_tool = false -%}"
    "{%- for tool in message['tool_calls'] %}"
    "{%- if not ns.is_first %}{{ '<\uff5cAssistant\uff5c><\uff5ctool\u2581calls\u2581begin\uff5c>' }}{%- set ns.is_first = true -%}{%- else %}{{ '\\n' }}{%- endif %}"
    "{{ '<\uff5ctool\u2581call\u2581begin\uff5c>' + tool['type'] + '<\uff5ctool\u2581sep\uff5c>' + tool['function']['name'] + '\\n```json\\n' + tool['function']['arguments'] + '\\n```<\uff5ctool\u2581call\u2581end\uff5c>' }}"
    "{%- endfor %}{{ '<\uff5ctool\u2581calls\u2581end\uff5c><\uff5cend\u2581of\u2581sentence\uff5c>' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- set content = message['content'] %}{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1] %}{%- endif %}"
    "{%- if ns.is_tool %}{{ '<\uff5ctool\u2581outputs\u2581end\uff5c>' }}{%- set ns.is_tool = false -%}{%- endif %}"
    "{{ '<\uff5cAssistant\uff5c>' + content + '<\uff5cend\u2581of\u2581sentence\uff5c>' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if not ns.is_tool %}{{ '<\uff5ctool\u2581outputs\u2581begin\uff5c>' }}{%- set ns.is_tool = true -%}{%- else %}{{ '\\n' }}{%- endif %}"
    "{{ '<\uff5ctool\u2581output\u2581begin\uff5c>' + message['content'] + '<\uff5ctool\u2581output\u2581end\uff5c>' }}"
    "{%- endif %}{%- endfor %}"
    "{% if ns.is_tool %}{{ '<\uff5ctool\u2581outputs\u2581end\uff5c>' }}{% endif %}"
    "{% if add_generation_prompt and not ns.is_tool %}{{ '<\uff5cAssistant\uff5c><think>\\n' }}{% endif %}")

# Gemma-style: the system prompt folded into the first user turn, roles
# renamed, alternation enforced.
GEMMA_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- set role = "model" if message['role'] == 'assistant' else message['role'] -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\n' }}
{%- endif -%}
"""

CHAT_CASES = [
    (DEEPSEEK_TEMPLATE, {"bos_token": "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
                         "messages": [{"role": "system", "content": "S."}, {"role": "user", "content": "q"},
                                      {"role": "assistant", "content": None, "tool_calls": [
                                          {"type": "function", "function": {"name": "a", "arguments": "{\"x\": 1}"}},
                                          {"type": "function", "function": {"name": "b", "arguments": "{}"}}]},
                                      {"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"},
                                      {"role": "assistant", "content": "<think>\nhidden\n</think>\n\nshown"},
                                      {"role": "user", "content": "q2"}], "add_generation_prompt": True}),
    (GEMMA_TEMPLATE, {"bos_token": "<bos>", "messages": [{"role": "system", "content": "Sys."},
                                                        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " look "}]},
                                                        {"role": "assistant", "content": " ok "}], "add_generation_prompt": True}),
    (GEMMA_TEMPLATE, {"bos_token": "<bos>", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}),
    (GEMMA_TEMPLATE, {"bos_token": "<bos>", "messages": [{"role": "user", "content": 5}]}),
    (QWEN3_TEMPLATE, {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "q1"},
                                   {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nanswer one"},
                                   {"role": "user", "content": "q2"},
                                   {"role": "assistant", "reasoning_content": "think 2", "content": "",
                                    "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                                                   {"function": {"name": "get_weather", "arguments": {"city": "東京", "days": 2}}}]},
                                   {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "rainy"}],
                      "tools": TOOLS, "add_generation_prompt": True}),
    (QWEN3_TEMPLATE, {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True, "enable_thinking": False}),
    (QWEN3_TEMPLATE, {"messages": [{"role": "user", "content": "<tool_response>x</tool_response>"}, {"role": "assistant", "content": "a"}],
                      "add_generation_prompt": False}),
    (HERMES_TEMPLATE, {"messages": [{"role": "user", "content": " hello "}, {"role": "assistant", "content": None}], "tools": TOOLS}),
    # integers beyond 64 bits in tools and tool calls
    (QWEN3_TEMPLATE, {"messages": [{"role": "user", "content": "q"},
                                   {"role": "assistant", "content": "", "tool_calls": [
                                       {"function": {"name": "get_weather", "arguments": {"station": 12345678901234567890, "offset": -9223372036854775809}}}]}],
                      "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
                          "station": {"type": "integer", "maximum": 10000000000000000000000, "default": 12345678901234567890}}}}}],
                      "add_generation_prompt": True}),
]


def main():
    out = []
    for src in CASES + CHAT_CASES:
        extra = {}
        if isinstance(src, tuple):
            src, extra = src
        case = {"template": src}
        if extra:
            case["vars"] = extra
        try:
            case["output"] = _compile_jinja_template(src).render(**{**V, **extra})
        except Exception as e:
            case["error"] = f"{type(e).__name__}: {e}"
        out.append(case)
    json.dump({"vars": V, "cases": out}, sys.stdout, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
