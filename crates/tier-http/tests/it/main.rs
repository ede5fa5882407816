//! tier-http's listener limits, end to end over loopback sockets.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

mod slow_clients;
mod support;
