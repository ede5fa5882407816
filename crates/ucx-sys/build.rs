//! Generates the UCX bindings with bindgen against the system headers found
//! by pkg-config (`ucx`), allowlisting only what `tierstack-fabric-ucx` uses.
//!
//! Without UCX (no pkg-config `ucx`) or without libclang the crate builds
//! empty: `AVAILABLE` is false and `UNAVAILABLE_REASON` says why, and the
//! `ucx` backend then refuses to open with a clear error. Setting
//! `TIERSTACK_REQUIRE_UCX=1` (CI does) turns that into a build failure.
//! Dependents learn the outcome from `DEP_UCP_AVAILABLE` (`links = "ucp"`).

use std::path::PathBuf;

const FUNCTIONS: &[&str] = &[
    "ucp_init_version",
    "ucp_cleanup",
    "ucp_config_read",
    "ucp_config_release",
    "ucp_get_version_string",
    "ucp_worker_create",
    "ucp_worker_destroy",
    "ucp_worker_get_address",
    "ucp_worker_release_address",
    "ucp_worker_progress",
    "ucp_worker_get_efd",
    "ucp_worker_arm",
    "ucp_worker_signal",
    "ucp_worker_fence",
    "ucp_worker_set_am_recv_handler",
    "ucp_ep_create",
    "ucp_ep_close_nbx",
    "ucp_ep_flush_nbx",
    "ucp_mem_map",
    "ucp_mem_unmap",
    "ucp_mem_query",
    "ucp_rkey_pack",
    "ucp_rkey_buffer_release",
    "ucp_ep_rkey_unpack",
    "ucp_rkey_destroy",
    "ucp_put_nbx",
    "ucp_get_nbx",
    "ucp_atomic_op_nbx",
    "ucp_am_send_nbx",
    "ucp_am_recv_data_nbx",
    "ucp_config_modify",
    "ucp_request_check_status",
    "ucp_request_free",
    "ucs_status_string",
];

const TYPES: &[&str] = &[
    "ucp_params_t",
    "ucp_worker_params_t",
    "ucp_ep_params_t",
    "ucp_mem_map_params_t",
    "ucp_mem_attr_t",
    "ucp_request_param_t",
    "ucp_am_handler_param_t",
    "ucp_am_recv_param_t",
    "ucs_status_t",
    "ucs_thread_mode_t",
    "ucp_params_field",
    "ucp_feature",
    "ucp_worker_params_field",
    "ucp_ep_params_field",
    "ucp_ep_close_flags_t",
    "ucp_mem_map_params_field",
    "ucp_mem_attr_field",
    "ucp_dt_type",
    "ucp_am_cb_flags",
    "ucp_send_am_flags",
    "ucp_atomic_op_t",
    "ucp_op_attr_t",
    "ucp_am_recv_attr_t",
    "ucp_am_handler_param_field",
    "ucp_err_handling_mode_t",
    "ucs_status_ptr_t",
    "ucp_datatype_t",
];

const VARS: &[&str] = &[
    "UCP_API_MAJOR",
    "UCP_API_MINOR",
    "UCP_DATATYPE_CONTIG",
    "UCP_DATATYPE_SHIFT",
    "UCP_PARAM_FIELD_.*",
    "UCP_FEATURE_.*",
    "UCP_WORKER_PARAM_FIELD_.*",
    "UCP_EP_PARAM_FIELD_.*",
    "UCP_EP_CLOSE_FLAG_.*",
    "UCP_MEM_MAP_PARAM_FIELD_.*",
    "UCP_MEM_MAP_.*",
    "UCP_MEM_ATTR_FIELD_.*",
    "UCP_OP_ATTR_FIELD_.*",
    "UCP_OP_ATTR_FLAG_.*",
    "UCP_AM_HANDLER_PARAM_FIELD_.*",
    "UCP_AM_FLAG_.*",
    "UCP_AM_SEND_FLAG_.*",
    "UCP_AM_RECV_ATTR_.*",
    "UCP_ATOMIC_OP_.*",
    "UCP_ERR_HANDLING_MODE_.*",
    "UCS_THREAD_MODE_.*",
    "UCS_OK",
    "UCS_INPROGRESS",
    "UCS_ERR_.*",
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-env-changed=TIERSTACK_REQUIRE_UCX");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=LIBCLANG_PATH");
    println!("cargo::rustc-check-cfg=cfg(ucx_available)");
    let required = std::env::var("TIERSTACK_REQUIRE_UCX").is_ok_and(|v| v == "1");
    match generate() {
        Ok(()) => {
            println!("cargo:rustc-cfg=ucx_available");
            println!("cargo:available=1");
        }
        Err(reason) => {
            if required {
                panic!("TIERSTACK_REQUIRE_UCX=1 but the UCX bindings cannot be built: {reason}");
            }
            let reason = reason.split_whitespace().collect::<Vec<_>>().join(" ");
            println!("cargo:warning=building without UCX ({reason}): install libucx-dev libclang-dev");
            println!("cargo:available=0");
            let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
            std::fs::write(out.join("reason.txt"), reason).expect("OUT_DIR is writable");
        }
    }
}

fn generate() -> Result<(), String> {
    let library =
        pkg_config::Config::new().atleast_version("1.13").probe("ucx").map_err(|e| format!("pkg-config ucx: {e}"))?;
    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .layout_tests(false)
        .generate_comments(false)
        .clang_args(library.include_paths.iter().map(|p| format!("-I{}", p.display())));
    for f in FUNCTIONS {
        builder = builder.allowlist_function(f);
    }
    for t in TYPES {
        builder = builder.allowlist_type(t);
    }
    for v in VARS {
        builder = builder.allowlist_item(v);
    }
    // bindgen panics when it cannot load libclang: that is a missing build
    // dependency, reported like a missing UCX.
    let generated = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || builder.generate()))
        .map_err(|_| "libclang could not be loaded (bindgen needs libclang-dev)".to_string())?
        .map_err(|e| format!("bindgen: {e}"))?;
    let out = PathBuf::from(std::env::var("OUT_DIR").map_err(|e| e.to_string())?);
    generated.write_to_file(out.join("bindings.rs")).map_err(|e| format!("writing the bindings: {e}"))
}
