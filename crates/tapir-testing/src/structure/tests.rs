use super::*;

/// A crate from `(path, text)` pairs.
fn sources(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files.iter().map(|&(p, t)| (p.to_string(), t.to_string())).collect()
}

/// The imports as `from:line path -> to` strings.
fn edges(files: &[(&str, &str)]) -> Vec<String> {
    imports(&sources(files)).iter().map(ToString::to_string).collect()
}

#[test]
fn use_trees_with_nested_braces_over_lines() {
    let e = edges(&[
        ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("a.rs", "use crate::{\n    b::{self, B},\n    c::{C, D as E},\n};\n"),
        ("b.rs", "pub struct B;"),
        ("c.rs", "pub struct C;\npub fn D() {}"),
    ]);
    assert_eq!(e, ["a.rs:1 `crate::b::B` -> b.rs", "a.rs:1 `crate::c::C` -> c.rs", "a.rs:1 `crate::c::D` -> c.rs"]);
}

#[test]
fn super_super_self_and_child_modules() {
    let e = edges(&[
        ("lib.rs", "mod top;\nmod x;\n"),
        ("top.rs", "pub fn t() {}"),
        ("x/mod.rs", "mod y;\nfn f() { y::z::deep(); }\n"),
        ("x/y/mod.rs", "pub mod z;\nuse super::super::top::t;\nuse self::z::deep;\n"),
        ("x/y/z.rs", "pub fn deep() {}"),
    ]);
    assert_eq!(
        e,
        [
            "x/mod.rs:2 `y::z::deep` -> x/y/z.rs",
            "x/y/mod.rs:2 `super::super::top::t` -> top.rs",
            "x/y/mod.rs:3 `self::z::deep` -> x/y/z.rs"
        ]
    );
}

#[test]
fn globs_import_the_module_file_and_test_modules_are_outside_the_graph() {
    let e = edges(&[
        ("lib.rs", "mod p;\nmod q;\n"),
        ("p/mod.rs", "mod c;\npub struct P;\n#[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::q::Q;\n}\n"),
        ("p/c.rs", "use super::*;\nfn f(_: P) {}\n"),
        ("q.rs", "pub struct Q;"),
    ]);
    // p/mod.rs's test module imports `crate::q::Q`: no edge, a unit test may reach anywhere.
    assert_eq!(e, ["p/c.rs:1 `super::*` -> p/mod.rs"]);
}

#[test]
fn dollar_crate_in_macros_and_paths_in_code() {
    let e = edges(&[
        ("lib.rs", "mod m;\nmod ops;\nmod v;\n"),
        ("m.rs", "macro_rules! mk { () => { $crate::ops::matmul::relinear() }; }\n"),
        ("ops/mod.rs", "pub mod matmul;"),
        ("ops/matmul.rs", "pub fn relinear() {}"),
        ("v.rs", "fn g() { let _ = crate::ops::matmul::relinear(); std::mem::drop(1); }"),
    ]);
    assert_eq!(
        e,
        [
            "m.rs:1 `$crate::ops::matmul::relinear` -> ops/matmul.rs",
            "v.rs:1 `crate::ops::matmul::relinear` -> ops/matmul.rs"
        ]
    );
}

#[test]
fn pub_use_chains_lead_to_the_defining_file() {
    let files = [
        ("lib.rs", "mod error;\nmod ops;\nmod tape;\npub use error::Error;\n"),
        ("error.rs", "pub enum Error {}"),
        ("ops/mod.rs", "mod unary;\npub(crate) use unary::{Exp as Expo, *};\n"),
        ("ops/unary.rs", "pub struct Exp;\npub struct Log;"),
        ("tape.rs", "use crate::ops::{Expo, Log};\nuse crate::Error;\nfn f() { crate::error::Error::x(); }\n"),
    ];
    let e = edges(&files);
    assert_eq!(
        e,
        [
            "tape.rs:1 `crate::ops::Expo` -> ops/unary.rs",
            "tape.rs:1 `crate::ops::Log` -> ops/unary.rs",
            "tape.rs:2 `crate::Error` -> error.rs",
            "tape.rs:3 `crate::error::Error::x` -> error.rs"
        ]
    );
    let findings = check_sources(&sources(&files), None);
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert!(matches!(&findings[0], Finding::ThroughRoot(i) if i.line == 2 && i.from == "tape.rs"), "{findings:?}");
}

#[test]
fn aliases_bound_by_use_lead_paths_in_code() {
    let e = edges(&[
        ("lib.rs", "mod kernels;\nmod ops;\n"),
        ("kernels/mod.rs", "pub mod matmul;"),
        ("kernels/matmul.rs", "pub fn gemm() {}"),
        ("ops.rs", "use crate::kernels;\nfn f() { kernels::matmul::gemm(); }\n"),
    ]);
    assert_eq!(e, ["ops.rs:2 `kernels::matmul::gemm` -> kernels/matmul.rs"]);
}

#[test]
fn comments_and_strings_are_not_imports() {
    let e = edges(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "// crate::b::B\n/* crate::b::B /* nested */ crate::b::B */\n/// [`crate::b::B`]\nfn f<'a>(x: &'a str) { let _ = (\"crate::b::B\", r#\"crate::b::B\"#, '\"'); }\n"),
        ("b.rs", "pub struct B;"),
    ]);
    assert!(e.is_empty(), "{e:?}");
}

#[test]
fn layers_circles_and_path_attributes_are_found() {
    let files = [
        ("lib.rs", "mod low;\nmod high;\n"),
        ("low.rs", "use crate::high::a::A;\n#[path = \"x.rs\"]\nmod hidden;\n"),
        ("high/mod.rs", "pub mod a;\npub mod b;\n"),
        ("high/a.rs", "pub struct A;\nuse super::b::B;\n"),
        ("high/b.rs", "pub struct B;\nuse super::a::A;\n"),
    ];
    let layers: Layers<'_> = &[("lib.rs", 9), ("low.rs", 0), ("high", 1)];
    let findings = check_sources(&sources(&files), Some(layers));
    let text: Vec<String> = findings.iter().map(ToString::to_string).collect();
    assert_eq!(text.len(), 3, "{text:#?}");
    assert_eq!(text[0], "#[path] attribute at low.rs:2");
    assert!(text[1].starts_with("upward import (layer 0 imports layer 1): low.rs:1"), "{text:#?}");
    assert!(text[2].starts_with("import circle of 2 files: high/a.rs, high/b.rs"), "{text:#?}");
}

#[test]
fn layer_of_takes_the_longest_entry() {
    let layers: Layers<'_> = &[("kernels", 1), ("kernels/vmath.rs", 0), ("lib.rs", 6)];
    assert_eq!(graph::layer_of(layers, "kernels/mod.rs"), Some(1));
    assert_eq!(graph::layer_of(layers, "kernels/vmath.rs"), Some(0));
    assert_eq!(graph::layer_of(layers, "kernelsx.rs"), None);
    assert_eq!(graph::layer_of(layers, "lib.rs"), Some(6));
}
