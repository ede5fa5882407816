//! UCX's callbacks, which run inside `ucp_worker_progress` on the progress
//! thread: they only record what happened ([`Event`]s in the thread-local
//! [`EVENTS`]) and free their requests; the loop in `progress` handles the
//! events after progress returns, so no callback touches the worker state.

use super::AM_HEADER_BYTES;
use crate::imp::ucx::status_text;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use tierstack_ucx_sys as sys;

/// What callbacks record during `ucp_worker_progress`.
pub(super) enum Event {
    /// A flush (batch) or active-message send finished.
    Done { id: u64, status: sys::ucs_status_t },
    /// A message or acknowledgement arrived.
    Am { header: [u8; AM_HEADER_BYTES], payload: Vec<u8> },
    /// A rendezvous receive of a message finished.
    RndvDone { id: u64, status: sys::ucs_status_t },
    /// An endpoint failed (peer failure).
    EpError { ep: usize, status: sys::ucs_status_t },
}

/// A rendezvous receive in flight: the message's header and its buffer.
type RndvReceive = ([u8; AM_HEADER_BYTES], Vec<u8>);

thread_local! {
    pub(super) static EVENTS: RefCell<Vec<Event>> = const { RefCell::new(Vec::new()) };
    /// Rendezvous receives in flight: id -> (header, buffer).
    pub(super) static RNDV: RefCell<HashMap<u64, RndvReceive>> = RefCell::new(HashMap::new());
    static RNDV_NEXT: std::cell::Cell<u64> = const { std::cell::Cell::new(1) };
}

fn record(event: Event) {
    EVENTS.with(|events| events.borrow_mut().push(event));
}

/// Completion callback of flushes and sends: `user_data` is the id.
unsafe extern "C" fn on_done(request: *mut c_void, status: sys::ucs_status_t, user_data: *mut c_void) {
    record(Event::Done { id: user_data as u64, status });
    // SAFETY: UCX passes the request this callback completes; freeing it in
    // its own callback is allowed, and nothing else holds it.
    unsafe { sys::ucp_request_free(request) };
}

unsafe extern "C" fn on_rndv_done(
    request: *mut c_void,
    status: sys::ucs_status_t,
    _length: usize,
    user_data: *mut c_void,
) {
    record(Event::RndvDone { id: user_data as u64, status });
    // SAFETY: as in `on_done`.
    unsafe { sys::ucp_request_free(request) };
}

pub(super) unsafe extern "C" fn on_ep_error(_arg: *mut c_void, ep: sys::ucp_ep_h, status: sys::ucs_status_t) {
    record(Event::EpError { ep: ep as usize, status });
}

/// The active-message handler: copies the payload (eager), or starts a
/// rendezvous receive into a buffer of ours. `arg` is the worker.
pub(super) unsafe extern "C" fn on_am(
    arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    if header_length != AM_HEADER_BYTES || header.is_null() || param.is_null() {
        tracing::warn!(header_length, "ucx: an active message with a malformed header was dropped");
        return sys::UCS_OK;
    }
    let mut head = [0u8; AM_HEADER_BYTES];
    // SAFETY: UCX passes `header_length` (checked: 16) readable bytes.
    unsafe { std::ptr::copy_nonoverlapping(header.cast::<u8>(), head.as_mut_ptr(), AM_HEADER_BYTES) };
    // SAFETY: `param` is valid for the duration of the callback.
    let recv_attr = unsafe { (*param).recv_attr };
    if recv_attr & u64::from(sys::UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 {
        // The sender forces eager, so this is unexpected; handle it anyway.
        let id = RNDV_NEXT.with(|n| {
            let id = n.get();
            n.set(id + 1);
            id
        });
        let mut buffer = vec![0u8; length];
        // SAFETY: zeroed is a valid value of this plain C struct.
        let mut request: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        request.op_attr_mask = sys::UCP_OP_ATTR_FIELD_CALLBACK | sys::UCP_OP_ATTR_FIELD_USER_DATA;
        request.cb.recv_am = Some(on_rndv_done);
        request.user_data = id as *mut c_void;
        // SAFETY: `arg` is the worker this handler was set on; `data` is the
        // rendezvous descriptor of this callback; `buffer` has `length`
        // bytes and is kept (in RNDV) until the receive completes.
        let status =
            unsafe { sys::ucp_am_recv_data_nbx(arg.cast(), data, buffer.as_mut_ptr().cast(), length, &request) };
        match sys::ucs_ptr_status(status) {
            sys::PtrStatus::Done => record(Event::Am { header: head, payload: buffer }),
            sys::PtrStatus::Error(s) => tracing::warn!(status = %status_text(s), "ucx: a rendezvous receive failed"),
            sys::PtrStatus::Request(_) => RNDV.with(|r| {
                r.borrow_mut().insert(id, (head, buffer));
            }),
        }
        return sys::UCS_OK;
    }
    let payload = if length == 0 || data.is_null() {
        Vec::new()
    } else {
        // SAFETY: UCX passes `length` readable bytes at `data` for the
        // duration of the callback; we copy them out before returning.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), length) }.to_vec()
    };
    record(Event::Am { header: head, payload });
    sys::UCS_OK
}

/// Request parameters with the completion callback and `id` as user data.
pub(super) fn callback_param(id: u64) -> sys::ucp_request_param_t {
    // SAFETY: zeroed is a valid value of this plain C struct.
    let mut param: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
    param.op_attr_mask = sys::UCP_OP_ATTR_FIELD_CALLBACK | sys::UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = Some(on_done);
    param.user_data = id as *mut c_void;
    param
}
