// Runs a page's script in node with a minimal stand-in for the DOM and prints, as JSON, the colour of
// every cell the page painted into its canvases (in paint order) and what it wrote into #render-info.
// Usage: node paint_in_node.js page.html [hash]. No browser is needed: the colours are the page's own
// computation (its colour scale, its pooling of nothing), which is what the tests check.
"use strict";
const fs = require("fs");

const page = fs.readFileSync(process.argv[2], "utf8");
const data = page.match(/<script type="application\/json" id="attnkit-data">([\s\S]*?)<\/script>/)[1];
const code = page.match(/<script>([\s\S]*?)<\/script>/)[1];
const painted = [];

class ImageData {
  constructor(w, h) { this.width = w; this.height = h; this.data = new Uint8ClampedArray(4 * w * h); }
}
const context = () => new Proxy({}, {
  get: (target, name) => {
    if (name === "measureText") return (t) => ({ width: 6 * String(t).length });
    if (name === "putImageData") return (img) => painted.push(Array.from(img.data));
    if (name in target) return target[name];
    return () => {};
  },
  set: (target, name, value) => { target[name] = value; return true; },
});
const elements = {};
function element(id) {
  if (!elements[id]) {
    elements[id] = { id, textContent: id === "attnkit-data" ? data : "", dataset: {}, style: {}, value: "0",
      children: [], appendChild(c) { this.children.push(c); return c; }, addEventListener() {},
      getContext: context, getAttribute: () => "viewer.html", getBoundingClientRect: () => ({ top: 0, left: 0 }) };
  }
  return elements[id];
}
let made = 0;
global.document = { getElementById: element, createElement: () => element("made" + made++) };
global.window = { devicePixelRatio: 1, addEventListener() {} };
global.location = { hash: process.argv[3] || "" };
global.history = { replaceState() {} };
global.ImageData = ImageData;
new Function(code)();
const cells = painted.map((rgba) => Array.from({ length: rgba.length / 4 }, (_, n) => rgba.slice(4 * n, 4 * n + 3)));
console.log(JSON.stringify({ cells, info: element("render-info").dataset, shape: element("shape").textContent }));
