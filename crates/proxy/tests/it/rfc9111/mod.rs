//! The proxy as an RFC 9111 shared cache, each behaviour through a real
//! proxy in front of a real origin written here (a small hyper server whose
//! every answer, field by field, the test decides; see `support`). One
//! module per part of the RFC: whole responses, storability (§3),
//! freshness (§4.2), validation (§4.3), `Vary` (§4.1), invalidation
//! (§4.4); then client conditionals and ranges; then responses with
//! dependencies (`X-Tierstack-Deps`), which keep the version-check
//! guarantee; the admin listener; and header fidelity as a property. One
//! test binary: linking one is cheaper than linking ten.
//!
//! Staleness is set up with `Age` (a response that arrives already old)
//! rather than by waiting for the clock; the policy's clock arithmetic is
//! unit-tested in `policy.rs` with the time passed in.

pub(crate) mod support;

mod admin;
mod conditionals;
mod cookies;
mod deps;
mod fidelity;
mod freshness;
mod interim;
mod invalidation;
mod languages;
mod parsing;
mod ranges;
mod stale_on_error;
mod storability;
mod validation;
mod vary;
mod whole;
