// Random Jinja expressions and small statements for the differential test of kiln's
// engine against @huggingface/jinja (JinjaOracle.RandomTemplatesMatchTheReference).
// Deterministic for a seed:   node tests/tokenizer/peers/jinja_fuzz.mjs SEED COUNT
// Prints a JSON list of {"name", "template", "context"}.
const seed = Number(process.argv[2] ?? 1);
const count = Number(process.argv[3] ?? 1000);

function mulberry32(a) {
  return () => {
    a |= 0;
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rand = mulberry32(seed);
const pick = (xs) => xs[Math.floor(rand() * xs.length)];
const chance = (p) => rand() < p;

const CONTEXT = {
  s: "Hello, Wörld ß 😀",
  e: "",
  w: "  padded\ttext \n",
  n: 7,
  z: 0,
  m: -3,
  f: 2.5,
  g: 4.0,
  t: true,
  no: false,
  nil: null,
  l: [3, 1, 2],
  ls: ["b", "A", "a", "c"],
  mixed: [1, "x", null, 2.5, true],
  nested: [[1, 2], [3, 4]],
  d: { b: 1, a: [1, 2], "10": "ten", "2": "two", c: { x: "y" } },
  people: [
    { name: "Ann", age: 31, admin: true },
    { name: "bob", age: 25, admin: false },
    { name: "Cy", age: 31 },
  ],
  empty: [],
  obj: {},
  json_text: '{"k": [1, 2]}',
};

const STRINGS = ["'a'", "'abc'", "''", "'A b_c'", "'é中😀'", '"x\\ny"', "'a,b,,c'", "'  sp  '", "'ΣΑΣ'", "'10'", "'3.5x'"];
const NUMBERS = ["0", "1", "2", "-1", "3", "10", "0.5", "1.0", "-2.5", "100"];
const VARS = Object.keys(CONTEXT).concat(["missing", "loop_var_missing"]);
const FILTERS = [
  "length", "upper", "lower", "title", "capitalize", "trim", "first", "last", "reverse", "sort", "unique", "join",
  "tojson", "string", "int", "float", "abs", "list", "items", "safe", "indent", "keys", "values", "dictsort",
  "join(', ')", "join('-')", "default('dflt')", "default('d', true)", "replace('a', 'X')", "replace('l', '', 1)",
  "tojson(indent=2)", "tojson(separators=(',', ':'))", "tojson(sort_keys=true)", "sort(reverse=true)",
  "sort(attribute='age')", "map(attribute='name')", "selectattr('admin')", "rejectattr('admin')",
  "selectattr('age', 'equalto', 31)", "indent(2, true)", "int(5)", "float(1.5)", "batch(2)", "round", "count",
];
const TESTS = [
  "defined", "undefined", "none", "string", "number", "integer", "boolean", "true", "false", "iterable", "mapping",
  "sequence", "odd", "even", "lower", "upper", "callable",
];
const METHODS = [
  ".upper()", ".lower()", ".strip()", ".lstrip()", ".rstrip()", ".title()", ".capitalize()", ".split()",
  ".split(',')", ".split(' ', 1)", ".replace('l', 'L')", ".startswith('H')", ".endswith(('x', '😀'))", ".length",
  ".items()", ".keys()", ".values()", ".get('b')", ".get('zz', 'dflt')", "[0]", "[-1]", "[1:]", "[::-1]", "[:2]",
  "[::2]", ".a", "['b']", ".c.x", "[5]", ".name",
];
// `**` only with integers (INT_POWERS): V8 computes non-integer powers with fdlibm, kiln with
// the C library, and the two may differ in the last bit.
const BINOPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">", "<=", ">=", "in", "not in", "and", "or"];

// `first` / `last` of an empty list give a bare JavaScript undefined in the reference,
// which crashes or misreports later uses (kiln makes it undefined): they only ever see
// the non-empty lists of FIRST_LAST.
const filter = () => pick(FILTERS.filter((f) => f !== "first" && f !== "last"));
const INT_POWERS = ["(2 ** 10)", "(3 ** -2)", "(-2 ** 3)", "(10 ** 21)", "(2 ** 0.5 * 0)", "(n ** 2)", "(f ** 2)", "(t ** 3)"];
const FIRST_LAST = ["(l | first)", "(ls | last)", "(people | last)", "(nested | first)", "(mixed | last)", "('abc' | list | first)"];

function atom(depth) {
  switch (Math.floor(rand() * 7)) {
    case 0: return pick(STRINGS);
    case 1: return pick(NUMBERS);
    case 2: return pick(["true", "false", "none", "True", "None", ...FIRST_LAST, ...INT_POWERS]);
    case 3:
    case 4: return pick(VARS);
    case 5: return depth > 0 ? `[${expr(depth - 1)}, ${expr(depth - 1)}]` : "[]";
    default: return depth > 0 ? `{'k': ${expr(depth - 1)}, 'a': 1}` : "{}";
  }
}

function expr(depth) {
  if (depth <= 0) return atom(0);
  switch (Math.floor(rand() * 9)) {
    case 0: return `${expr(depth - 1)} ${pick(BINOPS)} ${expr(depth - 1)}`;
    case 1: return `${atom(depth - 1)} | ${filter()}`;
    case 2: return `${atom(depth - 1)} is ${chance(0.3) ? "not " : ""}${pick(TESTS)}`;
    case 3: return `${pick(VARS)}${pick(METHODS)}`;
    case 4: return `(${expr(depth - 1)} if ${expr(depth - 1)} else ${expr(depth - 1)})`;
    case 5: return `${pick(["not ", "-", ""])}(${expr(depth - 1)})`;
    case 6: return `(${expr(depth - 1)})${pick(METHODS)}`;
    case 7: return `${atom(depth - 1)} | ${filter()} | ${filter()}`;
    default: return atom(depth);
  }
}

function statement() {
  const e = () => expr(2);
  switch (Math.floor(rand() * 11)) {
    case 6: return `{% macro mac_m(a, b=${e()}) %}<{{ a }}|{{ b }}|{{ ${pick(["varargs", "kwargs", "a ~ b", "caller is defined"])} }}>{% endmacro %}{{ mac_m(${e()}) }}{{ mac_m(${e()}, ${e()}) }}{{ mac_m(1, 2, ${e()}) }}`;
    case 7: return `{% macro mac_w(x) %}[{{ caller(x) }}]{% endmacro %}{% call(v) mac_w(${e()}) %}{{ ${pick(["v", "v | tojson", e()])} }}{% endcall %}`;
    case 8: return `{% filter ${pick(["upper", "trim", "lower", "replace('a', 'b')", "indent(2)", "title", "length", "tojson"])} %} ${e()} {{ ${e()} }} {% endfilter %}`;
    case 9: return `{% for ${pick(["k, v in d.items()", "a, b in nested", "x in l | sort", "x in ls[::-1]", "x in range(5)"])} %}{% if ${e()} %}{% ${pick(["break", "continue"])} %}{% endif %}{{ loop.index0 }}{% endfor %}`;
    case 10: return `{{ ${e()}${pick(["[0]", "[1:]", "[::-1]", "[-2:]", "[:1]"])} }}|{{ (${e()}) ~ '' }}`;
    case 0: return `{{ ${e()} }}`;
    case 1: return `{% for x in ${pick(["l", "ls", "people", "d", "mixed", "nested", "empty", "range(3)", e()])} %}[{{ ${pick(["x", "loop.index", "loop.last", "x | tojson", e()])} }}]{% else %}none{% endfor %}`;
    case 2: return `{% if ${e()} %}yes{% elif ${e()} %}elif{% else %}no{% endif %}`;
    case 3: return `{% set v = ${e()} %}{{ v }}|{{ v | tojson }}`;
    case 4: return `{% set ns = namespace(acc=${pick(["''", "0", "[]"])}) %}{% for x in ${pick(["l", "ls", "mixed"])} %}{% set ns.acc = ns.acc + ${pick(["x", "x | string", "[x]", "1"])} %}{% endfor %}{{ ns.acc }}`;
    default: return `{{ ${e()} }}{{ ${e()} }}`;
  }
}

const jobs = [];
for (let i = 0; i < count; ++i) jobs.push({ name: `fuzz_${seed}_${i}`, template: statement(), context: CONTEXT });
process.stdout.write(JSON.stringify(jobs) + "\n");
