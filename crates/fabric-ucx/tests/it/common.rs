//! Shared helpers of the ucx backend's tests: loopback clusters over a
//! chosen UCX transport set, and the skip rule for builds without UCX (all
//! `tierstack_testkit`'s, named here as the tests have always named them).

pub(crate) use tierstack_testkit::nodes::ucx::{cluster, ucx_or_skip, SHM, TCP};
