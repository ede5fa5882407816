//! The simulator's clients follow `tierstack load`'s rules: the open loop's
//! schedule points and streams are the load client's own (its
//! `loadgen::arrival`, which the simulator mirrors because both are tools of
//! the same layer).

use tierstack_loadgen::arrival::stream_of as load_stream_of;
use tierstack_loadgen::{ArrivalSchedule as LoadSchedule, Arrivals as LoadArrivals};
use tierstack_sim::arrival::{stream_of, ArrivalSchedule};
use tierstack_sim::Arrivals;

#[test]
fn the_open_loops_schedule_is_the_load_clients() {
    for (ours, theirs) in [(Arrivals::Constant, LoadArrivals::Constant), (Arrivals::Poisson, LoadArrivals::Poisson)] {
        for rate in [1.0, 333.0, 2_000.0, 123_456.7] {
            for seed in [0, 1, 42, u64::MAX] {
                let simulated: Vec<u64> = ArrivalSchedule::new(ours, rate, seed).take(5_000).collect();
                let real: Vec<u64> = LoadSchedule::new(theirs, rate, seed).take(5_000).collect();
                assert_eq!(simulated, real, "{ours:?} at {rate}/s, seed {seed}");
            }
        }
    }
    for k in 0..100 {
        for streams in [0, 1, 3, 16] {
            assert_eq!(stream_of(k, streams), load_stream_of(k, streams));
        }
    }
}
