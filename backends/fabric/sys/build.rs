//! Finds the system libfabric, compiles the C shim over its `static inline`
//! calls, and generates the bindings with bindgen.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=shim.h");
    println!("cargo:rerun-if-changed=shim.c");
    let lib = match pkg_config::Config::new()
        .atleast_version("1.17")
        .probe("libfabric")
    {
        Ok(lib) => lib,
        Err(e) => {
            // The one thing a user must do by hand; say what it is.
            panic!(
                "tensorferry-fabric-sys needs libfabric 1.17 or newer with its headers \
                 (Debian: apt-get install libfabric-dev pkg-config): {e}"
            );
        }
    };
    let mut build = cc::Build::new();
    build.file("shim.c").warnings(true);
    for dir in &lib.include_paths {
        build.include(dir);
    }
    build.compile("ferry_fabric_shim");

    let mut bindings = bindgen::Builder::default()
        .header("shim.h")
        .allowlist_function("ferry_fi_.*")
        .allowlist_function("fi_getinfo|fi_freeinfo|fi_dupinfo|fi_fabric|fi_strerror|fi_tostr")
        .allowlist_type("fi_.*|fid_.*|fid")
        .allowlist_var("FI_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false);
    for dir in &lib.include_paths {
        bindings = bindings.clang_arg(format!("-I{}", dir.display()));
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .generate()
        .expect("bindgen could not parse libfabric's headers (is libclang installed?)")
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings.rs");
}
