//! The press crate's integration tests as one test binary, one module per suite.
//! `loom_ring.rs` stays a binary of its own: it is built and run only
//! under `--cfg tierstack_loom` (`.ci/run`).

mod proto_props;
mod ring_props;
mod view_props;
