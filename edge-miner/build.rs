//! The miner never links libtorch; only its tests do (they compare against the
//! libtorch reference). Give those test binaries a runpath to `$LIBTORCH/lib`.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if let Ok(t) = std::env::var("LIBTORCH") {
        let lib = std::path::Path::new(&t).join("lib");
        let lib = lib.canonicalize().unwrap_or(lib);
        println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{}", lib.display());
    }
}
