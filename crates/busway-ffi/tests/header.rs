//! The header in the repository is what cbindgen makes of this crate now: a change to the ABI
//! that did not regenerate it fails here. `BUSWAY_FFI_BLESS=1` writes it instead.

use std::path::Path;

#[test]
fn include_busway_h_is_what_cbindgen_makes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config =
        cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml reads");
    let mut made = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen reads the crate")
        .write(&mut made);
    let made = String::from_utf8(made).expect("the header is UTF-8");
    let path = dir.join("include/busway.h");
    if std::env::var_os("BUSWAY_FFI_BLESS").is_some() {
        std::fs::write(&path, &made).expect("include/busway.h is written");
        return;
    }
    let kept = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        kept == made,
        "include/busway.h is stale: run `BUSWAY_FFI_BLESS=1 cargo test --release -p busway-ffi --test header` and commit it"
    );
}
