//! Prints the Fig. 3a measurements on shm and tcp and the Redis comparison:
//! `cargo run --release -p tierstack-bench --example ddss_fig3a [iterations]`.
//! (The `tierstack bench ddss` command is the full experiment; this is the
//! measurement alone.)

use std::sync::Arc;
use tierstack_base::NodeId;
use tierstack_bench::ddss::measure::{measure, measure_redis, table, BenchOptions, RedisOutcome};
use tierstack_cluster::{local_cluster, Backend};
use tierstack_ddss::{Ddss, DdssConfig};

fn main() -> anyhow::Result<()> {
    let iterations = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(2000);
    let options = BenchOptions { iterations, warmup: iterations / 10, ..BenchOptions::default() };
    let mut rows = Vec::new();
    for backend in [Backend::Shm, Backend::Tcp] {
        let cluster = local_cluster(backend, 2)?;
        let config = DdssConfig::default().with_members(vec![NodeId(0), NodeId(1)]);
        let nodes: Vec<Arc<Ddss>> = cluster
            .fabrics()
            .iter()
            .map(|f| Ddss::start(f.clone(), config.clone()).map(Arc::new))
            .collect::<Result<_, _>>()?;
        rows.extend(measure(&nodes[0], NodeId(1), &options)?);
    }
    match measure_redis(&options) {
        RedisOutcome::Measured(redis) => rows.extend(redis),
        RedisOutcome::Skipped(reason) => eprintln!("SKIPPED redis: {reason}"),
        RedisOutcome::Failed(why) => {
            print!("{}", table(&rows));
            anyhow::bail!("the redis comparison failed: {why}");
        }
    }
    print!("{}", table(&rows));
    Ok(())
}
