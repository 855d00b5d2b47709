// Renders /openapi.json: every operation with its parameters, body and responses. Only
// textContent is ever set from the document, never HTML.
(function () {
  "use strict";
  var METHODS = ["get", "put", "post", "patch", "delete"];

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") node.textContent = attrs[k]; else node.setAttribute(k, attrs[k]);
    });
    (children || []).forEach(function (c) { if (c) node.appendChild(c); });
    return node;
  }

  function resolve(doc, schema, depth) {
    if (!schema || depth > 6) return schema;
    if (schema.$ref) {
      var name = schema.$ref.replace("#/components/schemas/", "");
      return resolve(doc, (doc.components.schemas || {})[name], depth + 1);
    }
    return schema;
  }

  // A schema as a compact, readable JSON-like outline.
  function outline(doc, schema, depth) {
    schema = resolve(doc, schema, 0) || {};
    var pad = new Array(depth + 1).join("  ");
    if (schema.allOf) {
      var merged = { type: "object", properties: {} };
      schema.allOf.forEach(function (part) {
        var p = resolve(doc, part, 0) || {};
        Object.keys(p.properties || {}).forEach(function (k) { merged.properties[k] = p.properties[k]; });
      });
      return outline(doc, merged, depth);
    }
    if (schema.oneOf || schema.anyOf) {
      return (schema.oneOf || schema.anyOf).map(function (s) { return outline(doc, s, depth); }).join(" | ");
    }
    if (schema.enum) return schema.enum.map(function (v) { return JSON.stringify(v); }).join(" | ");
    var type = Array.isArray(schema.type) ? schema.type.join("|") : schema.type;
    if (type === "object" || schema.properties) {
      var keys = Object.keys(schema.properties || {});
      if (!keys.length) return "{ any JSON }";
      if (depth > 4) return "{...}";
      return "{\n" + keys.map(function (k) {
        var prop = schema.properties[k];
        var req = (schema.required || []).indexOf(k) >= 0 ? "" : "?";
        return pad + "  " + k + req + ": " + outline(doc, prop, depth + 1);
      }).join(",\n") + "\n" + pad + "}";
    }
    if (type === "array" || (type || "").indexOf("array") >= 0) return "[" + outline(doc, schema.items, depth) + "]";
    var text = type || "any JSON";
    if (schema.pattern) text += " " + schema.pattern;
    return text;
  }

  function params(op) {
    if (!op.parameters || !op.parameters.length) return null;
    var rows = op.parameters.map(function (p) {
      return el("tr", {}, [
        el("td", {}, [el("code", { text: p.name })]),
        el("td", { text: p["in"] + (p.required ? ", required" : "") }),
        el("td", { text: p.description || "" })
      ]);
    });
    return el("table", {}, [el("tr", {}, [el("th", { text: "parameter" }), el("th", { text: "in" }), el("th", { text: "" })])].concat(rows));
  }

  function body(doc, op) {
    var rb = op.requestBody;
    if (!rb) return null;
    var type = Object.keys(rb.content || {})[0];
    var media = (rb.content || {})[type] || {};
    return el("div", {}, [
      el("h4", { text: "Request body (" + type + ")" }),
      rb.description ? el("p", { text: rb.description }) : null,
      el("pre", { text: outline(doc, media.schema, 0) })
    ]);
  }

  function responses(doc, op) {
    var rows = Object.keys(op.responses || {}).sort().map(function (status) {
      var r = op.responses[status];
      var type = Object.keys(r.content || {})[0];
      // Problems all share one shape, shown once at the end; the description names the types.
      var schema = type && type !== "application/problem+json" && r.content[type].schema;
      return el("tr", {}, [
        el("td", { "class": "status s" + status.charAt(0), text: status }),
        el("td", {}, [
          el("div", { text: (type === "application/problem+json" ? "problem: " : "") + (r.description || "") }),
          schema ? el("pre", { text: (type === "application/json" ? "" : type + " ") + outline(doc, schema, 0) }) : null
        ])
      ]);
    });
    return el("table", {}, [el("tr", {}, [el("th", { text: "status" }), el("th", { text: "response" })])].concat(rows));
  }

  function render(doc) {
    document.getElementById("title").textContent = doc.info.title + " " + doc.info.version;
    document.getElementById("summary").textContent = doc.info.description || "";
    var main = document.getElementById("ops");
    var toc = document.getElementById("toc");
    main.textContent = "";
    var byTag = {};
    Object.keys(doc.paths).forEach(function (path) {
      METHODS.forEach(function (m) {
        var op = doc.paths[path][m];
        if (!op) return;
        var tag = (op.tags || ["other"])[0];
        (byTag[tag] = byTag[tag] || []).push({ path: path, method: m, op: op });
      });
    });
    var tags = (doc.tags || []).map(function (t) { return t.name; });
    Object.keys(byTag).forEach(function (t) { if (tags.indexOf(t) < 0) tags.push(t); });
    tags.filter(function (t) { return byTag[t]; }).forEach(function (tag) {
      var info = (doc.tags || []).filter(function (t) { return t.name === tag; })[0] || {};
      toc.appendChild(el("a", { href: "#tag-" + tag, text: tag }));
      main.appendChild(el("h2", { id: "tag-" + tag, text: tag }));
      if (info.description) main.appendChild(el("p", { "class": "muted", text: info.description }));
      byTag[tag].forEach(function (e) {
        var open = security(doc, e.op);
        main.appendChild(el("details", { "class": "op" }, [
          el("summary", {}, [
            el("span", { "class": "method " + e.method, text: e.method }),
            el("span", { "class": "path", text: e.path }),
            el("span", { "class": "muted", text: e.op.summary ? "  " + e.op.summary : "" })
          ]),
          e.op.description ? el("p", { text: e.op.description }) : null,
          el("p", { "class": "muted", text: open }),
          params(e.op),
          body(doc, e.op),
          el("h4", { text: "Responses" }),
          responses(doc, e.op)
        ]));
      });
    });
  }

  function problems(doc) {
    var problem = (doc.components.schemas || {}).Problem;
    if (!problem) return;
    var main = document.getElementById("ops");
    document.getElementById("toc").appendChild(el("a", { href: "#problems", text: "problems" }));
    main.appendChild(el("h2", { id: "problems", text: "Problems (application/problem+json, RFC 9457)" }));
    if (problem.description) main.appendChild(el("p", { "class": "muted", text: problem.description }));
    main.appendChild(el("pre", { text: outline(doc, problem, 0) }));
  }

  function security(doc, op) {
    var reqs = op.security || doc.security || [];
    if (!reqs.length) return "No credential.";
    var optional = reqs.some(function (r) { return Object.keys(r).length === 0; });
    var named = reqs.some(function (r) { return Object.keys(r).length > 0; });
    if (optional && !named) return "Open: no credential needed.";
    if (optional) return "Credential: Authorization: Bearer, when the server requires it for this route.";
    return "Credential: Authorization: Bearer (an API key or a JWT) once the server has any configured.";
  }

  fetch("openapi.json", { headers: { Accept: "application/json" } })
    .then(function (r) { if (!r.ok) throw new Error("GET openapi.json: " + r.status); return r.json(); })
    .then(function (doc) { render(doc); problems(doc); })
    .catch(function (e) { document.getElementById("ops").textContent = String(e); });
})();
