//! Property tests of the cluster view and of Fig. 1 over it: random
//! sequences of what PRESS disseminates (loads, caching broadcasts, deaths,
//! restarts) and of decisions, checked after every step against a plainly
//! written model of `Servers[]` and the loads.

use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use tierstack_press::{decide, Branch, CachingEvent, ClusterView, Decision, Member, PolicyConfig};

#[derive(Clone, Debug)]
enum Step {
    Load(u16, u32),
    Caching(u16, u8, bool),
    Dead(u16),
    Alive(u16),
    Decide(u8, u64),
}

fn step(nodes: u16) -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..nodes, 0u32..40).prop_map(|(n, l)| Step::Load(n, l)),
        (0..nodes, 0u8..6, any::<bool>()).prop_map(|(n, f, s)| Step::Caching(n, f, s)),
        (0..nodes).prop_map(Step::Dead),
        (0..nodes).prop_map(Step::Alive),
        (0u8..6, prop_oneof![0u64..1000, Just(256 * 1024)]).prop_map(|(f, s)| Step::Decide(f, s)),
        (0u8..6, 0u64..1000).prop_map(|(f, s)| Step::Decide(f, s)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn view_matches_model_and_fig1_invariants_hold(
        (nodes, me, steps) in (1u16..6).prop_flat_map(|n| (Just(n), 0..n, prop::collection::vec(step(n), 0..80)))
    ) {
        let config = PolicyConfig { threshold: 20, ..PolicyConfig::default() };
        let mut view: ClusterView<u8> = ClusterView::new(nodes as usize, Member(me)).unwrap();
        let mut loads = vec![0u32; nodes as usize];
        let mut alive = vec![true; nodes as usize];
        let mut servers: BTreeMap<u8, BTreeSet<u16>> = BTreeMap::new();
        for s in steps {
            match s {
                Step::Load(n, l) => { view.set_load(Member(n), l); loads[n as usize] = l; }
                Step::Caching(n, f, start) => {
                    view.on_caching(Member(n), &f, if start { CachingEvent::Start } else { CachingEvent::Stop });
                    if start && alive[n as usize] { servers.entry(f).or_default().insert(n); }
                    if !start { if let Some(set) = servers.get_mut(&f) { set.remove(&n); } }
                }
                Step::Dead(n) => {
                    view.mark_dead(Member(n));
                    if n != me {
                        alive[n as usize] = false;
                        for set in servers.values_mut() { set.remove(&n); }
                    }
                }
                Step::Alive(n) => { view.mark_alive(Member(n)); alive[n as usize] = true; loads[n as usize] = 0; }
                Step::Decide(f, size) => {
                    let before: BTreeSet<u16> = servers.get(&f).cloned().unwrap_or_default();
                    let o = decide(&config, &mut view, &f, size);
                    let svc = match o.decision {
                        Decision::ServeUncached => { prop_assert_eq!(o.branch, Branch::Large); prop_assert!(size >= config.max_size_bytes); None }
                        Decision::ServeLocal => Some(me),
                        Decision::Forward(n) => { prop_assert_ne!(n, Member(me)); Some(n.0) }
                    };
                    if let Some(a) = o.added { servers.entry(f).or_default().insert(a.0); }
                    if let Some(svc) = svc {
                        prop_assert!(alive[svc as usize], "chose a dead node");
                        // The service node ends in Servers[file], as every branch but line 3 implies.
                        prop_assert!(servers[&f].contains(&svc));
                        // It was either already a server or was just added.
                        prop_assert!(before.contains(&svc) || o.added == Some(Member(svc)));
                        let t = config.threshold;
                        match o.branch {
                            Branch::FirstRequest => prop_assert!(before.is_empty()),
                            Branch::InitialCaches => prop_assert!(before.contains(&me) && loads[me as usize] <= t),
                            Branch::LeastLoadedServer => {
                                prop_assert!(!before.contains(&me) && loads[svc as usize] <= t);
                                let min = before.iter().map(|&n| loads[n as usize]).min().unwrap();
                                prop_assert_eq!(loads[svc as usize], min);
                                prop_assert!(before.iter().all(|&n| loads[n as usize] > min || n >= svc));
                            }
                            Branch::InitialTakesOver => prop_assert!(svc == me && loads[me as usize] < t),
                            Branch::IdleTakesOver => {
                                prop_assert!(loads[svc as usize] < t && loads[me as usize] >= t);
                                let min = (0..nodes).filter(|&n| alive[n as usize]).map(|n| loads[n as usize]).min().unwrap();
                                prop_assert_eq!(loads[svc as usize], min);
                            }
                            Branch::AllOverloaded => {
                                prop_assert!(loads[svc as usize] > t);
                                prop_assert!((0..nodes).filter(|&n| alive[n as usize]).all(|n| loads[n as usize] >= t));
                            }
                            Branch::Large => prop_assert!(false, "large without ServeUncached"),
                        }
                    } else {
                        prop_assert_eq!(o.added, None);
                    }
                }
            }
            servers.retain(|_, set| !set.is_empty());
            // The view equals the model after every step.
            prop_assert_eq!(view.files(), servers.len());
            for f in 0u8..6 {
                let got: BTreeSet<u16> = view.servers(&f).iter().map(|m| m.0).collect();
                prop_assert_eq!(&got, &servers.get(&f).cloned().unwrap_or_default());
                prop_assert!(got.iter().all(|&n| alive[n as usize]));
            }
            for n in 0..nodes {
                prop_assert_eq!(view.load(Member(n)), loads[n as usize]);
                prop_assert_eq!(view.is_alive(Member(n)), alive[n as usize]);
            }
            let ll = view.least_loaded();
            prop_assert!(alive[ll.index()]);
            for n in 0..nodes {
                if alive[n as usize] {
                    prop_assert!(loads[n as usize] > loads[ll.index()] || (loads[n as usize] == loads[ll.index()] && n >= ll.0));
                }
            }
        }
    }
}
