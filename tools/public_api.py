#!/usr/bin/env python3
"""Print the public API of a crate, one item per line, sorted, from its rustdoc JSON.

Make the JSON with nightly rustdoc (the JSON output is unstable), including the
`#[doc(hidden)]` items, which are listed and marked:

    cargo +nightly rustdoc -p tapir --lib -- \\
        -Z unstable-options --output-format json --document-hidden-items
    python3 tools/public_api.py target/doc/tapir.json
    # a crate that uses tapir's types: name tapir's JSON too (see "paths" below)
    python3 tools/public_api.py target/doc/tapir_nn.json --extern target/doc/tapir.json

Written for rustdoc JSON format_version 57 (a newer one is accepted with a warning; a
shape the renderer does not know stops it with an error, so nothing is silently lost).

What is listed: every path reachable from the crate root through public modules and
`pub use` (modules, structs and their public fields, enums and their variants, unions,
traits and their items, functions, constants, statics, type aliases, macros), each
under its *public* path. Internal module paths never appear: an item of this crate
named in a signature is written with its public path (the shortest one, then the
first in sort order, when it has several; the others are listed as `pub use` lines),
found by walking from the root module through the `use` items, not from rustdoc's
`paths` table, which gives the defining module. A crate-local item that no public path
reaches (a sealing supertrait, say) is written `<private>::Name`. Items of other crates
are written with their defining path from the `paths` table (`core::option::Option`),
which does not depend on how this crate's sources import them; for a dependency whose
JSON is given with `--extern` (a crate of this workspace, whose modules may move), with
their public path in that dependency (`tapir::Var`, not `tapir::graph::Var`).

Impls: every inherent and trait impl of this crate is listed as `impl<..> Trait for
Type where ..`, then each of its items: methods with their full signatures, associated
types and constants (an inherent method's line ends with its impl in `[..]` when the
impl has generics). Derived impls (`#[derive(Clone, Debug, ..)]`) are listed by their
header only, without a derive's hidden helper impls (`core::clone::TrivialClone` on
recent nightlies), which depend on the toolchain. Omitted: auto-trait impls (Send,
Sync, Unpin, UnwindSafe, ..., which rustdoc synthesises) and the copies of blanket
impls that rustdoc attaches to each type (`impl<T> From<T> for T`, ...); a blanket impl
that this crate writes is listed once, as written.

Line markers: `#[doc(hidden)]`, `#[non_exhaustive]`, `#[deprecated]`; trait items with a
default body end with `{ .. }`; structs with private fields show `{ .. }` or `_`.
"""

import argparse
import json
import sys

KNOWN_FORMAT = 57
CRATE = 0  # crate_id of the crate being documented


class Api:
    def __init__(self, doc, externs=()):
        self.doc = doc
        self.index = doc["index"]
        self.paths = doc["paths"]
        self.krate = self.index[str(doc["root"])]["name"]
        # item id -> every public path (tuple of segments) that reaches it
        self.public = {}
        # non-inlined re-exports: (public path, source as written, target id or None)
        self.foreign_uses = []
        self._walk(doc["root"], (self.krate,), set())
        self.canon = {i: min(ps, key=lambda p: (len(p), p)) for i, ps in self.public.items()}
        # For a dependency whose JSON was given: (defining path, kind) -> its public path.
        self.externs = {}
        for dep in externs:
            for i, summary in dep.paths.items():
                if summary["crate_id"] == CRATE:
                    public = dep.canon.get(int(i))
                    name = "::".join(public) if public else dep.krate + "::<private>::" + summary["path"][-1]
                    self.externs.setdefault(dep.krate, {})[(tuple(summary["path"]), summary["kind"])] = name

    # ---- reachability ------------------------------------------------------------------

    def item(self, i):
        return self.index.get(str(i))

    def _walk(self, module_id, prefix, seen):
        if module_id in seen:
            return
        seen = seen | {module_id}
        module = self.item(module_id)
        for child in module["inner"]["module"]["items"]:
            it = self.item(child)
            if it is None or it["visibility"] != "public":
                continue
            inner = it["inner"]
            if "use" in inner:
                use = inner["use"]
                target = self.item(use["id"]) if use["id"] is not None else None
                if use["is_glob"]:
                    if target is not None and "module" in target["inner"]:
                        self._walk(use["id"], prefix, seen)
                    elif target is not None and "enum" in target["inner"]:
                        for v in target["inner"]["enum"]["variants"]:
                            self._add(v, prefix + (self.item(v)["name"],), seen)
                    else:
                        self.foreign_uses.append((prefix + ("*",), use["source"] + "::*", use["id"]))
                    continue
                if target is None:
                    self.foreign_uses.append((prefix + (use["name"],), use["source"], use["id"]))
                    continue
                self._add(use["id"], prefix + (use["name"],), seen)
            elif it["name"] is not None:
                self._add(child, prefix + (it["name"],), seen)

    def _add(self, i, path, seen):
        self.public.setdefault(i, set()).add(path)
        it = self.item(i)
        if it is not None and "module" in it["inner"]:
            self._walk(i, path, seen)

    def path_of(self, i, written):
        """The public path of item `i`, or its external path; `written` is the fallback."""
        if i in self.canon:
            return "::".join(self.canon[i])
        summary = self.paths.get(str(i))
        if summary is not None and summary["crate_id"] != CRATE:
            krate = self.doc["external_crates"][str(summary["crate_id"])]["name"]
            if krate in self.externs:
                key = (tuple(summary["path"]), summary["kind"])
                return self.externs[krate].get(key, krate + "::<private>::" + summary["path"][-1])
            return "::".join(summary["path"])
        it = self.item(i)
        local = (summary is not None and summary["crate_id"] == CRATE) or (it is not None and it["crate_id"] == CRATE)
        last = written.split("::")[-1]
        if local:
            return "<private>::" + last
        return written

    # ---- types -------------------------------------------------------------------------

    def ty(self, t):
        if t is None:
            return "()"
        if isinstance(t, str):
            if t == "infer":
                return "_"
            raise ValueError(f"unknown type {t!r}")
        (kind, v), = t.items()
        if kind == "resolved_path":
            return self.path(v)
        if kind == "generic":
            return v
        if kind == "primitive":
            return "!" if v == "never" else v
        if kind == "tuple":
            if len(v) == 1:
                return f"({self.ty(v[0])},)"
            return "(" + ", ".join(self.ty(x) for x in v) + ")"
        if kind == "slice":
            return f"[{self.ty(v)}]"
        if kind == "array":
            return f"[{self.ty(v['type'])}; {v['len']}]"
        if kind == "borrowed_ref":
            lt = v["lifetime"] + " " if v["lifetime"] else ""
            mut = "mut " if v["is_mutable"] else ""
            return f"&{lt}{mut}{self.ty(v['type'])}"
        if kind == "raw_pointer":
            return ("*mut " if v["is_mutable"] else "*const ") + self.ty(v["type"])
        if kind == "dyn_trait":
            parts = [self.poly_trait(p) for p in v["traits"]]
            if v.get("lifetime"):
                parts.append(v["lifetime"])
            return "dyn " + " + ".join(parts)
        if kind == "impl_trait":
            return "impl " + self.bounds(v)
        if kind == "function_pointer":
            hrtb = self.hrtb(v.get("generic_params", []))
            return hrtb + self.header(v["header"]) + "fn" + self.sig(v["sig"], with_names=False)
        if kind == "qualified_path":
            self_ty = self.ty(v["self_type"])
            args = self.generic_args(v.get("args"))
            if v.get("trait") is not None:
                return f"<{self_ty} as {self.path(v['trait'])}>::{v['name']}{args}"
            return f"{self_ty}::{v['name']}{args}"
        if kind == "pat":
            return f"{self.ty(v['type'])} is {v['__pat_unstable_do_not_use']}"
        raise ValueError(f"unknown type kind {kind!r}")

    def path(self, p):
        return self.path_of(p["id"], p["path"]) + self.generic_args(p.get("args"))

    def generic_args(self, a):
        if a is None:
            return ""
        if isinstance(a, str):
            if a == "return_type_notation":
                return "(..)"
            raise ValueError(f"unknown generic args {a!r}")
        (kind, v), = a.items()
        if kind == "angle_bracketed":
            parts = [self.generic_arg(x) for x in v["args"]]
            parts += [self.constraint(c) for c in v["constraints"]]
            return "<" + ", ".join(parts) + ">" if parts else ""
        if kind == "parenthesized":
            out = "" if v["output"] is None else " -> " + self.ty(v["output"])
            return "(" + ", ".join(self.ty(x) for x in v["inputs"]) + ")" + out
        raise ValueError(f"unknown generic args kind {kind!r}")

    def generic_arg(self, g):
        if g == "infer":
            return "_"
        (kind, v), = g.items()
        if kind == "lifetime":
            return v
        if kind == "type":
            return self.ty(v)
        if kind == "const":
            return self.constant(v)
        raise ValueError(f"unknown generic arg kind {kind!r}")

    def constant(self, c):
        return c["expr"] if c.get("expr") is not None else str(c.get("value"))

    def constraint(self, c):
        name = c["name"] + self.generic_args(c.get("args"))
        (kind, v), = c["binding"].items()
        if kind == "equality":
            return f"{name} = {self.term(v)}"
        if kind == "constraint":
            return f"{name}: {self.bounds(v)}"
        raise ValueError(f"unknown constraint kind {kind!r}")

    def term(self, t):
        (kind, v), = t.items()
        if kind == "type":
            return self.ty(v)
        if kind == "constant":
            return self.constant(v)
        raise ValueError(f"unknown term kind {kind!r}")

    def poly_trait(self, p):
        return self.hrtb(p.get("generic_params", [])) + self.path(p["trait"])

    def bounds(self, bs):
        return " + ".join(self.bound(b) for b in bs)

    def bound(self, b):
        (kind, v), = b.items()
        if kind == "trait_bound":
            mod = {"none": "", "maybe": "?", "maybe_const": "~const "}[v["modifier"]]
            return mod + self.hrtb(v.get("generic_params", [])) + self.path(v["trait"])
        if kind == "outlives":
            return v
        if kind == "use":
            names = [x if isinstance(x, str) else next(iter(x.values())) for x in v]
            return "use<" + ", ".join(names) + ">"
        raise ValueError(f"unknown bound kind {kind!r}")

    def hrtb(self, params):
        if not params:
            return ""
        return "for<" + ", ".join(self.param(p) for p in params) + "> "

    # ---- generics ----------------------------------------------------------------------

    def param(self, p):
        (kind, v), = p["kind"].items()
        if kind == "lifetime":
            return p["name"] + (": " + " + ".join(v["outlives"]) if v["outlives"] else "")
        if kind == "type":
            s = p["name"]
            if v["bounds"]:
                s += ": " + self.bounds(v["bounds"])
            if v.get("default") is not None:
                s += " = " + self.ty(v["default"])
            return s
        if kind == "const":
            s = f"const {p['name']}: {self.ty(v['type'])}"
            if v.get("default") is not None:
                s += " = " + v["default"]
            return s
        raise ValueError(f"unknown generic param kind {kind!r}")

    def generics(self, g):
        """(`<..>` declaration, ` where ..` clause) of a Generics object."""
        params = [p for p in g["params"] if not self._synthetic(p)]
        decl = "<" + ", ".join(self.param(p) for p in params) + ">" if params else ""
        preds = [self.predicate(w) for w in g["where_predicates"]]
        return decl, (" where " + ", ".join(preds) if preds else "")

    @staticmethod
    def _synthetic(p):
        kind = p["kind"]
        return "type" in kind and kind["type"].get("is_synthetic", False)

    def predicate(self, w):
        (kind, v), = w.items()
        if kind == "bound_predicate":
            return self.hrtb(v.get("generic_params", [])) + f"{self.ty(v['type'])}: {self.bounds(v['bounds'])}"
        if kind == "lifetime_predicate":
            return f"{v['lifetime']}: " + " + ".join(v["outlives"])
        if kind == "eq_predicate":
            return f"{self.ty(v['lhs'])} == {self.term(v['rhs'])}"
        raise ValueError(f"unknown where predicate kind {kind!r}")

    # ---- functions ---------------------------------------------------------------------

    @staticmethod
    def header(h):
        s = ""
        if h["is_const"]:
            s += "const "
        if h["is_async"]:
            s += "async "
        if h["is_unsafe"]:
            s += "unsafe "
        abi = h["abi"]
        if abi != "Rust":
            name = abi if isinstance(abi, str) else next(iter(abi))
            s += f'extern "{name}" '
        return s

    def sig(self, sig, with_names=True):
        args = []
        for name, t in sig["inputs"]:
            if with_names and name == "self":
                args.append(self.self_arg(t))
            elif with_names:
                args.append(f"{name}: {self.ty(t)}")
            else:
                args.append(self.ty(t))
        if sig.get("is_c_variadic"):
            args.append("...")
        out = "" if sig["output"] is None else " -> " + self.ty(sig["output"])
        return "(" + ", ".join(args) + ")" + out

    def self_arg(self, t):
        if t == {"generic": "Self"}:
            return "self"
        if "borrowed_ref" in t and t["borrowed_ref"]["type"] == {"generic": "Self"}:
            r = t["borrowed_ref"]
            lt = r["lifetime"] + " " if r["lifetime"] else ""
            return "&" + lt + ("mut " if r["is_mutable"] else "") + "self"
        return "self: " + self.ty(t)

    def function(self, name, f):
        decl, where = self.generics(f["generics"])
        return f"{self.header(f['header'])}fn {name}{decl}{self.sig(f['sig'])}{where}"

    # ---- items -------------------------------------------------------------------------

    @staticmethod
    def markers(it):
        m = []
        for a in it["attrs"]:
            if a == "non_exhaustive":
                m.append("#[non_exhaustive]")
            elif isinstance(a, dict) and "other" in a and a["other"].replace(" ", "") == "#[doc(hidden)]":
                m.append("#[doc(hidden)]")
        if it.get("deprecation") is not None:
            m.append("#[deprecated]")
        return "".join(x + " " for x in sorted(m))

    def lines(self):
        out = set()
        for i, paths in self.public.items():
            it = self.item(i)
            if it is None:
                continue
            canon = self.canon[i]
            for p in paths:
                if p != canon:
                    out.add(f"pub use {'::'.join(p)} = {'::'.join(canon)}")
            self.item_lines(it, "::".join(canon), out)
        for p, source, target in self.foreign_uses:
            where = self.path_of(target, source) if target is not None else source
            out.add(f"pub use {'::'.join(p)} = {where}")
        for it in self.index.values():
            if "impl" in it["inner"] and it["crate_id"] == CRATE:
                self.impl_lines(it, out)
        return sorted(out)

    def item_lines(self, it, path, out):
        (kind, v), = it["inner"].items()
        mk = self.markers(it)
        if kind == "module":
            out.add(f"{mk}pub mod {path}")
        elif kind == "function":
            out.add(mk + "pub " + self.function(path, v))
        elif kind == "struct":
            decl, where = self.generics(v["generics"])
            sk = v["kind"]
            if sk == "unit":
                body = ";"
            elif "tuple" in sk:
                fields = []
                for n, f in enumerate(sk["tuple"]):
                    if f is None:
                        fields.append("_")
                    else:
                        fi = self.item(f)
                        fields.append(self.markers(fi) + "pub " + self.ty(fi["inner"]["struct_field"]))
                        out.add(f"{self.markers(fi)}pub field {path}::{n}: {self.ty(fi['inner']['struct_field'])}")
                body = "(" + ", ".join(fields) + ")"
            else:
                plain = sk["plain"]
                for f in plain["fields"]:
                    self.field_line(f, path, out)
                body = " { .. }" if plain["has_stripped_fields"] else " {}"
            out.add(f"{mk}pub struct {path}{decl}{body}{where}")
        elif kind == "union":
            decl, where = self.generics(v["generics"])
            for f in v["fields"]:
                self.field_line(f, path, out)
            body = " { .. }" if v["has_stripped_fields"] else " {}"
            out.add(f"{mk}pub union {path}{decl}{body}{where}")
        elif kind == "enum":
            decl, where = self.generics(v["generics"])
            body = " { .. }" if v["has_stripped_variants"] else ""
            out.add(f"{mk}pub enum {path}{decl}{body}{where}")
            for var in v["variants"]:
                self.variant_line(self.item(var), path, out)
        elif kind == "variant":
            # a variant re-exported by a glob `use Enum::*`: it is listed under its enum
            pass
        elif kind == "trait":
            decl, where = self.generics(v["generics"])
            words = ("unsafe " if v["is_unsafe"] else "") + ("auto " if v["is_auto"] else "")
            sup = ": " + self.bounds(v["bounds"]) if v["bounds"] else ""
            out.add(f"{mk}pub {words}trait {path}{decl}{sup}{where}")
            for t in v["items"]:
                ti = self.item(t)
                if ti is not None:
                    self.assoc_line(ti, path, out, in_trait=True)
        elif kind == "trait_alias":
            decl, where = self.generics(v["generics"])
            out.add(f"{mk}pub trait {path}{decl} = {self.bounds(v['params'])}{where}")
        elif kind == "type_alias":
            decl, where = self.generics(v["generics"])
            out.add(f"{mk}pub type {path}{decl}{where} = {self.ty(v['type'])}")
        elif kind == "constant":
            out.add(f"{mk}pub const {path}: {self.ty(v['type'])} = {self.constant(v['const'])}")
        elif kind == "static":
            mut = "mut " if v["is_mutable"] else ""
            unsafe = "unsafe " if v.get("is_unsafe") else ""
            out.add(f"{mk}pub {unsafe}static {mut}{path}: {self.ty(v['type'])}")
        elif kind == "macro":
            out.add(f"{mk}pub macro {path}!")
        elif kind == "proc_macro":
            out.add(f"{mk}pub proc_macro {path} ({v['kind']})")
        elif kind in ("primitive", "extern_crate"):
            out.add(f"{mk}pub {kind} {path}")
        else:
            raise ValueError(f"unknown item kind {kind!r} at {path}")

    def field_line(self, f, owner, out):
        fi = self.item(f)
        if fi is None or fi["visibility"] != "public":
            return
        out.add(f"{self.markers(fi)}pub field {owner}::{fi['name']}: {self.ty(fi['inner']['struct_field'])}")

    def variant_line(self, vi, enum_path, out):
        v = vi["inner"]["variant"]
        name = f"{enum_path}::{vi['name']}"
        vk = v["kind"]
        if vk == "plain":
            body = ""
        elif "tuple" in vk:
            body = "(" + ", ".join("_" if f is None else self.ty(self.item(f)["inner"]["struct_field"]) for f in vk["tuple"]) + ")"
        else:
            st = vk["struct"]
            fields = [f"{self.item(f)['name']}: {self.ty(self.item(f)['inner']['struct_field'])}" for f in st["fields"]]
            if st["has_stripped_fields"]:
                fields.append("..")
            body = " { " + ", ".join(fields) + " }" if fields else " {}"
        disc = f" = {v['discriminant']['expr']}" if v.get("discriminant") else ""
        out.add(f"{self.markers(vi)}pub variant {name}{body}{disc}")

    def assoc_line(self, ai, owner, out, in_trait, ctx=""):
        """A trait's item (`owner` is the trait's path) or an impl's (`owner` is `Type` or
        `<Type as Trait>`; `ctx` names the impl when it has generics)."""
        (kind, v), = ai["inner"].items()
        mk = self.markers(ai)
        vis = "pub " if not in_trait and not owner.startswith("<") else ""
        name = f"{owner}::{ai['name']}"
        if kind == "function":
            default = " { .. }" if in_trait and v["has_body"] else ""
            out.add(f"{mk}{vis}{self.function(name, v)}{default}{ctx}")
        elif kind == "assoc_const":
            value = f" = {v['value']}" if v.get("value") is not None else ""
            out.add(f"{mk}{vis}const {name}: {self.ty(v['type'])}{value}{ctx}")
        elif kind == "assoc_type":
            decl, where = self.generics(v["generics"])
            bounds = ": " + self.bounds(v["bounds"]) if v["bounds"] else ""
            value = f" = {self.ty(v['type'])}" if v.get("type") is not None else ""
            out.add(f"{mk}{vis}type {name}{decl}{bounds}{where}{value}{ctx}")
        else:
            raise ValueError(f"unknown associated item kind {kind!r} in {owner}")

    def impl_lines(self, it, out):
        v = it["inner"]["impl"]
        if v["is_synthetic"] or v["blanket_impl"] is not None:
            return
        decl, where = self.generics(v["generics"])
        self_ty = self.ty(v["for"])
        mk = self.markers(it)
        if v["trait"] is None:
            # An inherent impl: its public items, each with the impl's generics (if any).
            ctx = f"  [impl{decl} {self_ty}{where}]" if decl or where else ""
            for a in v["items"]:
                ai = self.item(a)
                if ai is not None and ai["visibility"] == "public":
                    self.assoc_line(ai, self_ty, out, in_trait=False, ctx=ctx)
            return
        neg = "!" if v["is_negative"] else ""
        unsafe = "unsafe " if v["is_unsafe"] else ""
        trait = self.path(v["trait"])
        header = f"impl{decl} {neg}{trait} for {self_ty}{where}"
        if "automatically_derived" in it["attrs"]:
            # A derive's hidden helper impls (`core::clone::TrivialClone` on recent nightlies)
            # depend on the toolchain, not on the crate: left out.
            if not mk:
                out.add(f"{unsafe}{header}")
            return
        out.add(f"{mk}{unsafe}{header}")
        ctx = f"  [{header}]" if decl or where else ""
        for a in v["items"]:
            ai = self.item(a)
            if ai is not None:
                self.assoc_line(ai, f"<{self_ty} as {trait}>", out, in_trait=False, ctx=ctx)


def load(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if doc.get("format_version") != KNOWN_FORMAT:
        print(f"public_api.py: {path}: rustdoc JSON format_version {doc.get('format_version')}, written for {KNOWN_FORMAT}", file=sys.stderr)
    return doc


def main(argv):
    parser = argparse.ArgumentParser(description="Print a crate's public API, one item per line.")
    parser.add_argument("json", help="the crate's rustdoc JSON (TARGET/doc/CRATE.json)")
    parser.add_argument(
        "--extern",
        action="append",
        default=[],
        metavar="DEP_JSON",
        help="a dependency's rustdoc JSON: its items are written with their public paths, "
        "not the defining ones (repeatable)",
    )
    args = parser.parse_args(argv[1:])
    externs = [Api(load(p)) for p in args.extern]
    for line in Api(load(args.json), externs).lines():
        print(line.rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
