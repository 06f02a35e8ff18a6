// Render math spans one at a time with KaTeX and with MathJax 3, as a notebook viewer would, and
// report each span's errors (tests/test_colab_edition.py drives it; `make setup` installs both).
//
//   node tools/mathcheck/render.js < spans.json > errors.json
//
// Input: a JSON list of {"tex": "...", "display": true|false}. Output: a JSON list of the same
// length, each item {"katex": null|"message", "mathjax": null|"message"}. Each span starts from
// nothing: KaTeX gets a fresh macro table per span, and MathJax refuses every definition command
// (so no span can define what a later one uses). MathJax loads the packages a browser's tex-chtml
// component provides or autoloads, but not `noundefined` (an undefined macro must be an error, not
// red text) nor `physics` (no viewer loads it by default).
"use strict";
const fs = require("fs");
const katex = require("katex");
const { mathjax } = require("mathjax-full/js/mathjax.js");
const { TeX } = require("mathjax-full/js/input/tex.js");
const { liteAdaptor } = require("mathjax-full/js/adaptors/liteAdaptor.js");
const { RegisterHTMLHandler } = require("mathjax-full/js/handlers/html.js");
require("mathjax-full/js/input/tex/AllPackages.js");

const PACKAGES = ["base", "ams", "newcommand", "boldsymbol", "action", "amscd", "bbox", "braket",
  "cancel", "cases", "centernot", "color", "colortbl", "enclose", "extpfeil", "gensymb", "html",
  "mathtools", "mhchem", "upgreek", "unicode", "verb", "textcomp", "textmacros"];
const DEFINITIONS = /\\(newcommand|renewcommand|providecommand|def|gdef|edef|xdef|let|DeclareMathOperator|newenvironment|renewenvironment)(?![A-Za-z])/;

RegisterHTMLHandler(liteAdaptor());
const tex = new TeX({
  packages: PACKAGES,
  formatError: (jax, err) => { throw err; },
});
const doc = mathjax.document("", { InputJax: tex });

function withKatex(span) {
  try {
    katex.renderToString(span.tex, { displayMode: span.display, throwOnError: true, strict: "ignore",
                                     macros: {} });
    return null;
  } catch (e) {
    return String(e.message || e);
  }
}

function withMathjax(span) {
  const def = span.tex.match(DEFINITIONS);
  if (def) return `defines a macro (${def[0]}): nothing may carry over to another span`;
  try {
    doc.convert(span.tex, { display: span.display });
    return null;
  } catch (e) {
    return String(e.message || e);
  }
}

const spans = JSON.parse(fs.readFileSync(0, "utf8"));
const out = spans.map(span => ({ katex: withKatex(span), mathjax: withMathjax(span) }));
process.stdout.write(JSON.stringify(out));
