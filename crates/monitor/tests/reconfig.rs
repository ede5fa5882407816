//! The role word over a real fabric: one CAS claim, exactly one winner
//! among contending agents, and moves that only the holder can complete.

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
    let _other = cluster.fabric(2).register(tierstack_monitor::reconfig::ROLE_REGION, 24).unwrap();
    let b = cluster.fabric(1).connect(NodeId(2), tierstack_monitor::reconfig::ROLE_REGION).unwrap();
    assert!(matches!(read_role(b.as_ref()), Err(MonitorError::NotARoleRegion { .. })));
}
