//! Property tests of the cluster model: random request/validate/invalidate
//! sequences under every scheme, with every invariant checked after each step.

use proptest::prelude::*;
use tierstack_coop::{pages_for, Model, ModelConfig, Scheme, Served, PAGE_BYTES};

#[derive(Clone, Debug)]
enum Op {
    Request { node: usize, key: u64 },
    Invalidate { node: usize, key: u64 },
}

fn ops(active: usize, nodes: usize) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            9 => (0..active, 0u64..24).prop_map(|(node, key)| Op::Request { node, key }),
            1 => (0..nodes, 0u64..24).prop_map(|(node, key)| Op::Invalidate { node, key }),
        ],
        1..200,
    )
}

fn schemes() -> impl Strategy<Value = Scheme> {
    prop::sample::select(vec![
        Scheme::Ac,
        Scheme::Bcc,
        Scheme::Ccwr,
        Scheme::Mtacc,
        Scheme::Hybcc { small_max_bytes: PAGE_BYTES },
        Scheme::Groupcache,
    ])
}

/// Copies beyond the first, summed over entities.
fn extra_copies(m: &Model, keys: u64) -> usize {
    (0..keys).map(|k| m.holders(k).len().saturating_sub(1)).sum()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Capacity is never exceeded, page accounting and holder sets stay
    /// exact, no stale copy survives an invalidate, and no entity leaves the
    /// system except by a counted replacement or an invalidate.
    #[test]
    fn no_byte_lost_and_capacity_never_exceeded(
        scheme in schemes(),
        active in 1usize..4,
        passive in 0usize..3,
        pages in 1u32..7,
        sizes in prop::collection::vec(1u64..3 * PAGE_BYTES, 24),
        script in ops(3, 5),
    ) {
        let mut m = Model::new(ModelConfig { scheme, active, passive, pages_per_node: pages }).unwrap();
        for op in script {
            let before = m.distinct_entities();
            match op {
                Op::Request { node, key } => {
                    let node = node % active;
                    let bytes = sizes[key as usize];
                    let was_cached = !m.holders(key).is_empty();
                    let out = m.request(node, key, bytes).unwrap();
                    prop_assert_eq!(out.version, m.version(key), "served a stale version");
                    if was_cached {
                        let missed = matches!(out.served, Served::Miss { .. });
                        prop_assert!(!missed || scheme == Scheme::Ac, "a cached entity missed");
                    }
                    let added = usize::from(!was_cached && !m.holders(key).is_empty());
                    prop_assert_eq!(m.distinct_entities() + out.lost as usize, before + added);
                }
                Op::Invalidate { node, key } => {
                    let node = node % m.node_count();
                    let had = usize::from(!m.holders(key).is_empty());
                    m.invalidate(node, key).unwrap();
                    prop_assert_eq!(m.distinct_entities(), before - had);
                    prop_assert!(m.holders(key).is_empty());
                }
            }
            if let Err(e) = m.check() {
                prop_assert!(false, "{}", e);
            }
        }
    }

    /// CCWR keeps one copy: once every node is full, copies beyond the first
    /// never increase, and a sole copy is replaced only when no candidate
    /// node could have made room from free pages or duplicates.
    #[test]
    fn ccwr_keeps_one_copy(
        mtacc in any::<bool>(),
        active in 2usize..4,
        pages in 1u32..5,
        script in prop::collection::vec((0usize..4, 0u64..20), 1..300),
    ) {
        let scheme = if mtacc { Scheme::Mtacc } else { Scheme::Ccwr };
        let passive = if mtacc { 2 } else { 0 };
        let mut m = Model::new(ModelConfig { scheme, active, passive, pages_per_node: pages }).unwrap();
        let bytes = 2 * PAGE_BYTES;
        let need = pages_for(bytes);
        let candidates = if mtacc { active + passive } else { active };
        for (node, key) in script {
            let node = node % active;
            let all_full = (0..candidates).all(|n| m.node(n).unwrap().free_pages() < need);
            let extra_before = extra_copies(&m, 20);
            let room_somewhere = (0..candidates).any(|n| {
                let s = m.space(n);
                s.free_pages + s.redundant_pages >= need
            });
            let out = m.request(node, key, bytes).unwrap();
            if all_full {
                prop_assert!(extra_copies(&m, 20) <= extra_before, "a full CCWR cluster grew its duplicates");
            }
            if out.lost > 0 {
                prop_assert!(!room_somewhere, "replaced a sole copy while a node had room from duplicates");
            }
            prop_assert!(m.check().is_ok());
        }
    }
}

#[test]
fn bcc_does_grow_duplicates_where_ccwr_does_not() {
    // The contrast that makes the property above meaningful.
    let run = |scheme| {
        let mut m = Model::new(ModelConfig { scheme, active: 2, passive: 0, pages_per_node: 8 }).unwrap();
        for i in 0..400u64 {
            let key = tierstack_coop::key::mix(i) % 12;
            m.request((i % 2) as usize, key, PAGE_BYTES).unwrap();
        }
        extra_copies(&m, 12)
    };
    assert!(run(Scheme::Bcc) > run(Scheme::Ccwr), "{} vs {}", run(Scheme::Bcc), run(Scheme::Ccwr));
}
