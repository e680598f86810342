//! Build script shared by every crate that links libtorch (through `tch`):
//! bakes a runpath to `$LIBTORCH/lib` into its binaries, tests and benches,
//! so they run with no LD_LIBRARY_PATH. LIBTORCH comes from .cargo/config.toml.
//!
//! They look first in `$ORIGIN/../lib/tributary/torch/lib` (for tests a
//! folder that does not exist): where installers/install-roles.sh puts
//! libtorch beside the installed binaries, so an installed validator or trainer loads it as its service user,
//! who cannot read the builder's virtual environment.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN/../lib/tributary/torch/lib");
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
