//! tier-http's listener limits and its front (TLS, HTTP/2), end to end over
//! loopback sockets.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

mod front;
mod slow_clients;
mod support;
