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
]


def main():
    out = []
    for src in CASES:
        case = {"template": src}
        try:
            case["output"] = _compile_jinja_template(src).render(**V)
        except Exception as e:
            case["error"] = f"{type(e).__name__}: {e}"
        out.append(case)
    json.dump({"vars": V, "cases": out}, sys.stdout, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
