//! Message channels on the ucx backend: the backend-neutral scenarios of
//! `tierstack_testkit::channels`, on loopback nodes of one
//! process, over UCX shared memory and over UCX TCP. (The scenario of a bad
//! channel byte on a raw connection has no counterpart: a ucx message is an
//! active message whose header the receiver checks, dropping one that
//! names an unknown channel.)

use crate::common;
use tierstack_testkit::channels;

use channels::SEND_TIMEOUT;
use std::sync::Arc;
use tierstack_fabric::Fabric;

fn nodes(n: u32, transports: &str) -> Option<Vec<Arc<dyn Fabric>>> {
    if !common::ucx_or_skip() {
        return None;
    }
    Some(common::cluster(0, n, transports, SEND_TIMEOUT).into_iter().map(|f| f as Arc<dyn Fabric>).collect())
}

macro_rules! both_transports {
    ($name:ident, $body:expr) => {
        mod $name {
            #[test]
            fn over_shm() {
                ($body)(super::common::SHM);
            }
            #[test]
            fn over_tcp() {
                ($body)(super::common::TCP);
            }
        }
    };
}

both_transports!(messages_stay_on_their_channel, |tls| {
    let Some(nodes) = super::nodes(2, tls) else { return };
    super::channels::messages_stay_on_their_channel(nodes[0].clone(), nodes[1].clone());
});

both_transports!(per_sender_order_holds_per_channel_with_several_senders, |tls| {
    let Some(nodes) = super::nodes(4, tls) else { return };
    super::channels::per_sender_order_holds_per_channel(nodes[1..].to_vec(), nodes[0].clone());
});

both_transports!(out_of_range_channels_are_typed_errors, |tls| {
    let Some(nodes) = super::nodes(2, tls) else { return };
    super::channels::out_of_range_channels_are_typed_errors(nodes[0].as_ref(), nodes[1].as_ref());
});

both_transports!(a_full_channel_holds_back_only_itself, |tls| {
    let Some(nodes) = super::nodes(2, tls) else { return };
    let outcome = super::channels::a_full_channel_holds_back_only_itself(nodes[0].clone(), nodes[1].clone());
    assert_eq!(outcome, super::channels::FullChannelOutcome::EXPECTED);
});

both_transports!(a_try_send_never_waits_on_a_full_channel, |tls| {
    let Some(nodes) = super::nodes(2, tls) else { return };
    let outcome = super::channels::a_try_send_never_waits_on_a_full_channel(nodes[0].clone(), nodes[1].clone());
    assert_eq!(outcome, super::channels::TrySendOutcome::EXPECTED);
});
