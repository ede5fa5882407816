//! Transfers naming local registered memory on the ucx backend: the shared
//! conformance suite (`tierstack_testkit::transfers`),
//! over UCX's shared-memory transports (`sysv,self`) and over its TCP
//! transport (`tcp,self`). Here a `WriteFrom` is put straight from the
//! local region, and a `ReadInto` lands in a bounce buffer that is copied
//! into its target only when the batch succeeds.

use crate::common;
use tierstack_testkit::transfers as suite;

use std::sync::Arc;
use std::time::Duration;
use tierstack_fabric_ucx::UcxFabric;

/// Node 0 owns the remote regions; node 1 operates on them.
fn pair(transports: &str) -> Option<(Arc<UcxFabric>, Arc<UcxFabric>)> {
    if !common::ucx_or_skip() {
        return None;
    }
    let mut nodes = common::cluster(0, 2, transports, Duration::from_secs(5));
    let peer = nodes.pop()?;
    Some((nodes.pop()?, peer))
}

macro_rules! both_transports {
    ($($name:ident),* $(,)?) => {
        mod over_shm {
            $(
                #[test]
                fn $name() {
                    let Some((owner, peer)) = super::pair(super::common::SHM) else { return };
                    super::suite::$name(owner.as_ref(), peer.as_ref());
                }
            )*
        }
        mod over_tcp {
            $(
                #[test]
                fn $name() {
                    let Some((owner, peer)) = super::pair(super::common::TCP) else { return };
                    super::suite::$name(owner.as_ref(), peer.as_ref());
                }
            )*
        }
    };
}

both_transports!(
    round_trips_match_plain_reads_and_writes,
    large_transfers_round_trip,
    bounds_errors_are_typed_and_execute_nothing,
    alignment_follows_the_same_phase_rule,
    a_batch_mixes_old_and_new_ops,
    a_view_sees_the_bytes_that_arrived_before_it,
    words_read_at_once_match_a_batch_of_reads,
);

/// The owner closes its node: it says `BYE` on its hello connections and
/// waits for the answers, so every transfer of the peer's then fails with
/// `PeerDead` (UCX's shared-memory key would still reach the memory).
fn read_into_a_dead_peer_is_peer_dead(transports: &str) {
    let Some((owner, peer)) = pair(transports) else { return };
    let (remote, local) = suite::before_the_owner_dies(owner.as_ref(), peer.as_ref());
    drop(owner);
    suite::read_into_a_dead_peer_fails_and_writes_nothing(remote.as_ref(), &local);
}

#[test]
fn read_into_a_dead_peer_is_peer_dead_over_shm() {
    read_into_a_dead_peer_is_peer_dead(common::SHM);
}

#[test]
fn read_into_a_dead_peer_is_peer_dead_over_tcp() {
    read_into_a_dead_peer_is_peer_dead(common::TCP);
}
