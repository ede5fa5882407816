//! The UCX context: the one object shared between the progress thread and
//! the regions' memory (which may outlive the fabric).

use super::progress::Mapped;
use std::ffi::{CStr, CString};
use std::sync::Mutex;
use tierstack_base::NodeId;
use tierstack_fabric::{FabricError, Result};
use tierstack_ucx_sys as sys;

/// A UCX context with the RMA, 64-bit atomic and active-message features.
///
/// Context-level calls (`ucp_mem_map`, `ucp_mem_unmap`, `ucp_rkey_pack`)
/// come from the progress thread while it runs and from a region's last
/// owner after it stopped; `lock` serializes them, and the context is made
/// with `mt_workers_shared` so UCX guards its own shared state too.
pub(crate) struct Context {
    handle: sys::ucp_context_h,
    lock: Mutex<()>,
}

// SAFETY: the handle is only used under `lock` (context calls) or by the
// progress thread (worker creation, before any other use); UCX's context is
// created thread-shared (`mt_workers_shared = 1`).
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

pub(crate) fn status_text(status: sys::ucs_status_t) -> String {
    // SAFETY: ucs_status_string returns a static C string for any status.
    let text = unsafe { sys::ucs_status_string(status) };
    if text.is_null() {
        return format!("UCX status {status}");
    }
    // SAFETY: non-null, NUL-terminated, static.
    unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
}

/// A UCX failure status as a fabric error: the peer-failure family means
/// the peer is dead (for now), anything else is an I/O error.
pub(crate) fn status_error(node: NodeId, status: sys::ucs_status_t, what: &str) -> FabricError {
    let text = status_text(status);
    match status {
        sys::UCS_ERR_CANCELED
        | sys::UCS_ERR_UNREACHABLE
        | sys::UCS_ERR_CONNECTION_RESET
        | sys::UCS_ERR_ENDPOINT_TIMEOUT
        | sys::UCS_ERR_REJECTED
        | sys::UCS_ERR_NOT_CONNECTED
        | sys::UCS_ERR_TIMED_OUT => FabricError::PeerDead { node, reason: format!("{what}: {text}") },
        s if (sys::UCS_ERR_LAST_ENDPOINT_FAILURE..=sys::UCS_ERR_FIRST_ENDPOINT_FAILURE).contains(&s)
            || (sys::UCS_ERR_LAST_LINK_FAILURE..=sys::UCS_ERR_FIRST_LINK_FAILURE).contains(&s) =>
        {
            FabricError::PeerDead { node, reason: format!("{what}: {text}") }
        }
        _ => FabricError::Io(format!("{what}: {text}")),
    }
}

fn check(status: sys::ucs_status_t, what: &str) -> Result<()> {
    if status == sys::UCS_OK {
        Ok(())
    } else {
        Err(FabricError::Io(format!("{what}: {}", status_text(status))))
    }
}

impl Context {
    /// `ucp_init` with RMA, AMO64 and AM; `transports` overrides `UCX_TLS`.
    pub(crate) fn new(transports: Option<&str>) -> Result<Context> {
        let mut config: *mut sys::ucp_config_t = std::ptr::null_mut();
        // SAFETY: reads UCX_* from the environment into a new config.
        check(unsafe { sys::ucp_config_read(std::ptr::null(), std::ptr::null(), &mut config) }, "ucp_config_read")?;
        let result = (|| {
            if let Some(tls) = transports {
                let value = CString::new(tls).map_err(|_| FabricError::Io("UCX transports contain a NUL".into()))?;
                // SAFETY: valid config; both strings are NUL-terminated.
                check(unsafe { sys::ucp_config_modify(config, c"TLS".as_ptr(), value.as_ptr()) }, "UCX_TLS")?;
            }
            // SAFETY: zeroed is a valid value of this plain C struct.
            let mut params: sys::ucp_params_t = unsafe { std::mem::zeroed() };
            params.field_mask = u64::from(sys::UCP_PARAM_FIELD_FEATURES | sys::UCP_PARAM_FIELD_MT_WORKERS_SHARED);
            params.features = u64::from(
                sys::UCP_FEATURE_RMA | sys::UCP_FEATURE_AMO64 | sys::UCP_FEATURE_AM | sys::UCP_FEATURE_WAKEUP,
            );
            params.mt_workers_shared = 1;
            let mut handle: sys::ucp_context_h = std::ptr::null_mut();
            // SAFETY: `ucp_init` is an inline wrapper of this call with the
            // header's API version; params and config are valid.
            let rc =
                unsafe { sys::ucp_init_version(sys::UCP_API_MAJOR, sys::UCP_API_MINOR, &params, config, &mut handle) };
            check(rc, "ucp_init")?;
            Ok(Context { handle, lock: Mutex::new(()) })
        })();
        // SAFETY: the config is ours and no longer needed.
        unsafe { sys::ucp_config_release(config) };
        result
    }

    /// A worker: single-threaded (only the progress thread uses it), with
    /// wake-up events for its event fd.
    pub(crate) fn create_worker(&self) -> Result<sys::ucp_worker_h> {
        // SAFETY: zeroed is a valid value of this plain C struct.
        let mut params: sys::ucp_worker_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = u64::from(sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE);
        params.thread_mode = sys::UCS_THREAD_MODE_SINGLE;
        let mut worker: sys::ucp_worker_h = std::ptr::null_mut();
        let _guard = self.lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // SAFETY: valid context and params; `worker` is written by the call.
        check(unsafe { sys::ucp_worker_create(self.handle, &params, &mut worker) }, "ucp_worker_create")?;
        Ok(worker)
    }

    /// Allocates and registers `bytes` bytes (`UCP_MEM_MAP_ALLOCATE`), and
    /// packs the remote key peers need.
    /// The mapping's protection allows remote reads only when some peer may
    /// read, remote writes (and atomics, which UCX counts as writes) only
    /// when some peer may modify: on transports that enforce it (RDMA), a
    /// peer cannot exceed the widest rights even with a forged key.
    pub(crate) fn map(&self, bytes: u64, widest: tierstack_fabric::Rights) -> Result<Mapped> {
        let length = usize::try_from(bytes).map_err(|_| FabricError::RegionSize { bytes, max: bytes })?;
        let _guard = self.lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // SAFETY: zeroed is a valid value of this plain C struct.
        let mut params: sys::ucp_mem_map_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = u64::from(
            sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS
                | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH
                | sys::UCP_MEM_MAP_PARAM_FIELD_FLAGS
                | sys::UCP_MEM_MAP_PARAM_FIELD_PROT,
        );
        let mut prot = sys::UCP_MEM_MAP_PROT_LOCAL_READ | sys::UCP_MEM_MAP_PROT_LOCAL_WRITE;
        if widest.contains(tierstack_fabric::Rights::READ) {
            prot |= sys::UCP_MEM_MAP_PROT_REMOTE_READ;
        }
        if widest.modifies() {
            prot |= sys::UCP_MEM_MAP_PROT_REMOTE_WRITE;
        }
        params.prot = prot as _;
        params.address = std::ptr::null_mut();
        params.length = length;
        params.flags = sys::UCP_MEM_MAP_ALLOCATE;
        let mut memh: sys::ucp_mem_h = std::ptr::null_mut();
        // SAFETY: valid context and params; `memh` is written by the call.
        check(unsafe { sys::ucp_mem_map(self.handle, &params, &mut memh) }, "ucp_mem_map")?;
        let unmap = |memh| {
            // SAFETY: a handle we just mapped, unmapped once on failure.
            unsafe { sys::ucp_mem_unmap(self.handle, memh) };
        };
        // SAFETY: zeroed is a valid value of this plain C struct.
        let mut attr: sys::ucp_mem_attr_t = unsafe { std::mem::zeroed() };
        attr.field_mask = u64::from(sys::UCP_MEM_ATTR_FIELD_ADDRESS | sys::UCP_MEM_ATTR_FIELD_LENGTH);
        // SAFETY: valid handle; `attr` is written by the call.
        if let Err(e) = check(unsafe { sys::ucp_mem_query(memh, &mut attr) }, "ucp_mem_query") {
            unmap(memh);
            return Err(e);
        }
        if attr.address.is_null() || attr.length < length || !(attr.address as usize).is_multiple_of(8) {
            unmap(memh);
            return Err(FabricError::Io("ucp_mem_map returned memory that is too short or misaligned".into()));
        }
        let mut packed: *mut std::ffi::c_void = std::ptr::null_mut();
        let mut packed_len: usize = 0;
        // SAFETY: valid context and handle; the out-pointers are written.
        let rc = unsafe { sys::ucp_rkey_pack(self.handle, memh, &mut packed, &mut packed_len) };
        if let Err(e) = check(rc, "ucp_rkey_pack") {
            unmap(memh);
            return Err(e);
        }
        // SAFETY: UCX returned `packed_len` bytes at `packed`, released below.
        let rkey = unsafe { std::slice::from_raw_parts(packed.cast::<u8>(), packed_len) }.to_vec();
        // SAFETY: releasing the packed buffer UCX gave us, once.
        unsafe { sys::ucp_rkey_buffer_release(packed) };
        Ok(Mapped { memh: memh as usize, base: attr.address as usize, rkey })
    }

    /// Unmaps a handle from [`Context::map`].
    pub(crate) fn unmap(&self, memh: usize) {
        let _guard = self.lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // SAFETY: `memh` came from `map` on this context and is unmapped once
        // (its region's owner sends it here exactly once).
        let status = unsafe { sys::ucp_mem_unmap(self.handle, memh as sys::ucp_mem_h) };
        if status != sys::UCS_OK {
            tracing::warn!(status = %status_text(status), "ucx: ucp_mem_unmap failed");
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the last user is gone (workers destroyed, regions unmapped).
        unsafe { sys::ucp_cleanup(self.handle) };
    }
}
