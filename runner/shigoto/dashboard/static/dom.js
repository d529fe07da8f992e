// Building elements without markup strings. Every value reaches the page as a text node or an
// attribute set through the DOM, never parsed as HTML: job args, errors and tags are written by
// whoever enqueued the job and must be treated as hostile.

const SVG_NS = "http://www.w3.org/2000/svg";

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function assign(node, props) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.setAttribute("class", Array.isArray(value) ? value.filter(Boolean).join(" ") : value);
    else if (key === "dataset") for (const [k, v] of Object.entries(value)) node.dataset[k] = String(v);
    else if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else if (value === true) node.setAttribute(key, "");
    else node.setAttribute(key, String(value));
  }
  return node;
}

/** An HTML element: `h("td", {class: "num"}, 42)`. Children are nodes or text. */
export function h(tag, props, ...children) {
  return append(assign(document.createElement(tag), props), children);
}

/** An SVG element, for the charts. */
export function s(tag, props, ...children) {
  return append(assign(document.createElementNS(SVG_NS, tag), props), children);
}

/** Replace everything inside `node` with `children`. */
export function replace(node, ...children) {
  node.replaceChildren();
  return append(node, children);
}
