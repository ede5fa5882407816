//! Service behaviour shared by every long-running command: it lives below
//! the tiers, in `tierstack_tier_http::service`, so that each tier's
//! argument struct can flatten [`ServiceArgs`]; the commands name it here.

pub(crate) use tierstack_tier_http::service::{announce_ready, drain, ServiceArgs, GRACE_MS_DEFAULT};
