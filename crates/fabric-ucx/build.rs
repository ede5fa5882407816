//! Compiles the backend only when `tierstack-ucx-sys` generated its bindings
//! (it says so through `DEP_UCP_AVAILABLE`, its `links = "ucp"` metadata);
//! otherwise the crate builds the stand-in that refuses to open.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(ucx_available)");
    println!("cargo:rerun-if-env-changed=DEP_UCP_AVAILABLE");
    if std::env::var("DEP_UCP_AVAILABLE").is_ok_and(|v| v == "1") {
        println!("cargo:rustc-cfg=ucx_available");
    }
}
