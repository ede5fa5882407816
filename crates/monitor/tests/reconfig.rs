//! The role word over a real fabric: one CAS claim, exactly one winner
//! among contending agents, and moves that only the holder can complete.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is the failure report.

use std::sync::{Arc, Barrier};
use tierstack_base::NodeId;
use tierstack_cluster::{local_cluster, Backend};
use tierstack_monitor::reconfig::{claim, complete_move, read_role, register_role, release, Claim, RoleWord};
use tierstack_monitor::MonitorError;

/// K agents (each its own fabric node) race to claim the same node, round
/// after round; each round exactly one wins, and only the winner's move
/// lands, with the next epoch.
#[test]
fn exactly_one_agent_wins_each_claim() {
    const AGENTS: u32 = 4;
    for (backend, rounds) in [(Backend::Shm, 200u32), (Backend::Tcp, 20)] {
        let cluster = local_cluster(backend, AGENTS + 1).unwrap();
        let _role = register_role(cluster.fabric(0).as_ref(), 0).unwrap();
        let barrier = Arc::new(Barrier::new(AGENTS as usize));
        let agents: Vec<_> = (1..=AGENTS)
            .map(|agent| {
                let fabric = cluster.fabric(agent as usize).clone();
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    let region = fabric.connect(NodeId(0), tierstack_monitor::reconfig::ROLE_REGION).unwrap();
                    let mut won = Vec::new();
                    for round in 0..rounds {
                        barrier.wait();
                        // Everyone read the same unclaimed word before anyone claims.
                        let seen = read_role(region.as_ref()).unwrap().role;
                        barrier.wait();
                        if let Claim::Won(mine) = claim(region.as_ref(), seen, agent as u16).unwrap() {
                            won.push(round);
                            let to_site = (mine.site + 1) % 2;
                            complete_move(region.as_ref(), mine, to_site, u64::from(round) + 1).unwrap();
                        }
                        barrier.wait();
                    }
                    won
                })
            })
            .collect();
        let mut winners = vec![0u32; rounds as usize];
        for agent in agents {
            for round in agent.join().unwrap() {
                winners[round as usize] += 1;
            }
        }
        assert!(winners.iter().all(|w| *w == 1), "{}: winners per round {winners:?}", backend.name());
        let region = cluster.fabric(1).connect(NodeId(0), tierstack_monitor::reconfig::ROLE_REGION).unwrap();
        let view = read_role(region.as_ref()).unwrap();
        assert_eq!(view.role, RoleWord { site: (rounds % 2) as u16, epoch: 1 + rounds, holder: None });
        assert_eq!(view.moved_at_ns, u64::from(rounds));
    }
}

#[test]
fn only_the_holder_completes_or_releases_and_a_claimed_word_is_not_claimed_again() {
    let cluster = local_cluster(Backend::Shm, 3).unwrap();
    let _role = register_role(cluster.fabric(0).as_ref(), 4).unwrap();
    let a = cluster.fabric(1).connect(NodeId(0), tierstack_monitor::reconfig::ROLE_REGION).unwrap();
    let seen = read_role(a.as_ref()).unwrap().role;
    assert_eq!(seen, RoleWord { site: 4, epoch: 1, holder: None });
    let Claim::Won(mine) = claim(a.as_ref(), seen, 7).unwrap() else { panic!("first claim must win") };
    // A second agent that read the word before the claim loses, and one
    // that reads it now sees it held.
    assert_eq!(claim(a.as_ref(), seen, 8).unwrap(), Claim::Lost(mine));
    assert_eq!(claim(a.as_ref(), mine, 8).unwrap(), Claim::Lost(mine));
    // Someone else's idea of the claimed word cannot move or release it.
    let forged = RoleWord { holder: Some(8), ..mine };
    assert!(matches!(complete_move(a.as_ref(), forged, 5, 1), Err(MonitorError::NotHolder { .. })));
    assert!(matches!(release(a.as_ref(), forged), Err(MonitorError::NotHolder { .. })));
    release(a.as_ref(), mine).unwrap();
    assert_eq!(read_role(a.as_ref()).unwrap().role, seen, "released unmoved: same site and epoch");
    // A region that is not a role region is refused.
    let _other = cluster
        .fabric(2)
        .register(tierstack_monitor::reconfig::ROLE_REGION, 24, tierstack_fabric::Access::all())
        .unwrap();
    let b = cluster.fabric(1).connect(NodeId(2), tierstack_monitor::reconfig::ROLE_REGION).unwrap();
    assert!(matches!(read_role(b.as_ref()), Err(MonitorError::NotARoleRegion { .. })));
}

/// The agent over a real fabric: nodes 1 (site 0) and 2, 3 (site 1) publish
/// their load and role; with node 1 busy, one step moves site 1's idlest
/// node to site 0 with the next epoch; a second agent then finds nothing to
/// do (site 1 keeps its last node), and a node that never published is left
/// out of the window.
#[test]
fn the_agent_moves_the_idle_sites_least_loaded_node_once() {
    use std::time::Duration;
    use tierstack_monitor::{AgentEvent, Gauge, LoadPublisher, ReconfigAgent, ReconfigConfig};
    let cluster = local_cluster(Backend::Shm, 6).unwrap();
    let mut publishers = Vec::new();
    let mut roles = Vec::new();
    for (node, site) in [(1usize, 0u16), (2, 1), (3, 1)] {
        publishers.push(LoadPublisher::register(cluster.fabric(node).as_ref()).unwrap());
        roles.push(register_role(cluster.fabric(node).as_ref(), site).unwrap());
    }
    // Node 4 has a role but never publishes its load: not in any window.
    let _silent = register_role(cluster.fabric(4).as_ref(), 1).unwrap();
    let config = ReconfigConfig { ratio: 2.0, windows: 1, history_ns: 1_000_000_000, min_nodes_per_site: 1 };
    let nodes = [NodeId(1), NodeId(2), NodeId(3), NodeId(4)];
    let window = Duration::from_millis(10);
    let mut first = ReconfigAgent::connect(cluster.fabric(0).clone(), 0, &nodes, config, window).unwrap();
    let mut second = ReconfigAgent::connect(cluster.fabric(5).clone(), 1, &nodes, config, window).unwrap();
    assert_eq!(first.step(1_000).unwrap(), None, "no load anywhere: nothing to move");
    let _busy: Vec<_> = (0..10).map(|_| publishers[0].enter(Gauge::InFlightRequests)).collect();
    let _some = publishers[1].enter(Gauge::InFlightRequests);
    assert_eq!(
        first.step(2_000).unwrap(),
        Some(AgentEvent::Moved { node: NodeId(3), from_site: 1, to_site: 0, epoch: 2 }),
        "site 1's least-loaded node goes to the busy site"
    );
    let region = cluster.fabric(0).connect(NodeId(3), tierstack_monitor::reconfig::ROLE_REGION).unwrap();
    let view = read_role(region.as_ref()).unwrap();
    assert_eq!((view.role, view.moved_at_ns), (RoleWord { site: 0, epoch: 2, holder: None }, 2_000));
    // (10 + 0) / 2 against 1: still over the ratio, but site 1 has one
    // published node left (the silent node 4 would otherwise be taken).
    assert_eq!(second.step(3_000).unwrap(), None, "site 1 keeps its last published node");
    assert_eq!(first.step(4_000).unwrap(), None);
}
