//! Build script shared by every crate that links libtorch (through `tch`):
//! bakes a runpath to `$LIBTORCH/lib` into its binaries, tests and benches,
//! so they run with no LD_LIBRARY_PATH. LIBTORCH comes from .cargo/config.toml.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if let Ok(t) = std::env::var("LIBTORCH") {
        let lib = std::path::Path::new(&t).join("lib");
        let lib = lib.canonicalize().unwrap_or(lib);
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
        // `cuda` feature: keep libtorch_cuda in NEEDED (the default --as-needed drops it).
        if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
            println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
        }
    }
}
