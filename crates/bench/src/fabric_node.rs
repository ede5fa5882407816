//! The fabric node tools of `tierstack fabric …`: a node that serves
//! regions (with optional owner load and a seqlock writer), and clients that
//! perform one operation, contend on a region, or read seqlock records and
//! count torn reads. The multi-process fabric tests and `bench fabric` drive
//! them as processes; the binary only parses flags, opens the node and says
//! `ready`.
//!
//! They live in `bench`, not in `deploy`: `deploy` starts processes and
//! knows nothing of what they do, while these are what a measured or tested
//! process does on the fabric, the same kind of code as [`crate::dlm_nodes`].
//!
//! Every client prints one JSON object, built here ([`op`], [`hammer`],
//! [`seq_read`]).

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use tierstack_fabric::seqlock::SeqRecord;
use tierstack_fabric::{Channel, Fabric, FabricError, LocalRegion, RemoteRegion};
use tierstack_stats::exposition::Exposition;

/// Pause between the stress writer's rounds.
const SEQ_WRITER_PAUSE: Duration = Duration::from_micros(20);

/// Payload size of the stress records: several words, so tearing is possible.
pub const SEQ_PAYLOAD_BYTES: u32 = 64;

/// How long the responder waits for a message before it looks at the stop
/// flag again.
const RESPONDER_POLL: Duration = Duration::from_millis(100);

/// The operations of `fabric op`, by their command-line names.
pub const OPS: [&str; 4] = ["read-u64", "write-u64", "fetch-add", "compare-swap"];

/// The `index`-th stress record: a version word and [`SEQ_PAYLOAD_BYTES`], back to back.
fn seq_record(index: u32) -> Result<SeqRecord> {
    let footprint = 8 + u64::from(SEQ_PAYLOAD_BYTES);
    Ok(SeqRecord::new(u64::from(index) * footprint, SEQ_PAYLOAD_BYTES)?)
}

/// The first `count` stress records.
pub fn seq_records(count: u32) -> Result<Vec<SeqRecord>> {
    (0..count).map(seq_record).collect()
}

/// Performs one operation `op` (one of [`OPS`]); returns `{op, offset, result}`.
pub fn op(region: &dyn RemoteRegion, op: &str, offset: u64, value: u64, expected: u64) -> Result<Value> {
    let result = match op {
        "read-u64" => region.read_u64(offset)?,
        "write-u64" => {
            region.write(offset, &value.to_ne_bytes())?;
            value
        }
        "fetch-add" => region.fetch_add(offset, value)?,
        "compare-swap" => region.compare_swap(offset, expected, value)?,
        other => bail!("unknown op {other}"),
    };
    Ok(json!({ "op": op, "offset": offset, "result": result }))
}

/// `fetch_adds` fetch-adds of 1 on offset 0, then `cas_rounds` rounds in
/// which round r tries word r from 0 to `node + 1`; returns `{node,
/// fetch_adds, cas_wins}` with the rounds this node won.
pub fn hammer(region: &dyn RemoteRegion, node: u32, fetch_adds: u64, cas_rounds: u64) -> Result<Value> {
    for _ in 0..fetch_adds {
        region.fetch_add(0, 1)?;
    }
    let mut wins = Vec::new();
    for round in 0..cas_rounds {
        if region.compare_swap(8 * round, 0, u64::from(node) + 1)? == 0 {
            wins.push(round);
        }
    }
    Ok(json!({ "node": node, "fetch_adds": fetch_adds, "cas_wins": wins }))
}

/// Reads `records` `reads` times; returns `{reads, torn, version_changes}`
/// (a record is torn when its payload words differ: the writer writes them equal).
pub fn seq_read(region: &dyn RemoteRegion, records: &[SeqRecord], reads: u64) -> Result<Value> {
    let (mut torn, mut versions_seen_changing, mut last_version) = (0u64, 0u64, 0u64);
    for _ in 0..reads {
        for (version, payload) in tierstack_fabric::seqlock::read_many(region, records)? {
            let first = &payload[..8];
            if payload.chunks(8).any(|w| w != first) {
                torn += 1;
            }
            if version != last_version {
                versions_seen_changing += 1;
                last_version = version;
            }
        }
    }
    Ok(json!({ "reads": reads, "torn": torn, "version_changes": versions_seen_changing }))
}

/// What `fabric serve`'s `/metrics` reports: its regions, and the
/// messages its responder handled. (The one-sided operations on its
/// regions are served by the backend — the memory itself under shm, the
/// backend's responder under tcp — and counted nowhere here.)
pub struct ServingMetrics {
    regions: u64,
    region_bytes: u64,
    messages_received: AtomicU64,
    acknowledgements: AtomicU64,
    acknowledgement_errors: AtomicU64,
}

impl ServingMetrics {
    /// Messages the responder received so far.
    pub fn messages_received(&self) -> u64 {
        self.messages_received.load(Ordering::Relaxed)
    }

    /// Writes the `tierstack_fabric_*` families.
    pub fn write(&self, out: &mut Exposition) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        out.gauge("tierstack_fabric_regions", "Regions this node registered.", self.regions as f64);
        out.gauge(
            "tierstack_fabric_region_bytes",
            "Bytes of the regions this node registered.",
            self.region_bytes as f64,
        );
        out.counter(
            "tierstack_fabric_messages_received_total",
            "Messages received on the application channel.",
            self.messages_received(),
        );
        out.counter(
            "tierstack_fabric_acknowledgements_total",
            "One-byte acknowledgements sent back.",
            load(&self.acknowledgements),
        );
        out.counter(
            "tierstack_fabric_acknowledgement_errors_total",
            "Acknowledgements that could not be sent.",
            load(&self.acknowledgement_errors),
        );
    }
}

/// What `fabric serve` runs: registered regions, CPU burners, the seqlock
/// writer and the acknowledging responder, until [`stop`](Self::stop).
pub struct ServingNode {
    fabric: Arc<dyn Fabric>,
    registered: Vec<Arc<LocalRegion>>,
    stop: Arc<AtomicBool>,
    responder: JoinHandle<()>,
    metrics: Arc<ServingMetrics>,
}

impl ServingNode {
    /// Registers `regions` (name, bytes), starts `busy_threads` CPU burners
    /// (owner load), a writer rewriting `seq_records` stress records at the
    /// start of the first region (if any), and a responder that answers
    /// messages whose first byte is 1 with a one-byte message.
    pub fn start(
        fabric: Arc<dyn Fabric>,
        regions: &[(String, u64)],
        busy_threads: usize,
        seq_records: u32,
    ) -> Result<Self> {
        let mut registered = Vec::new();
        for (name, bytes) in regions {
            registered.push(
                fabric
                    .register(name, *bytes, tierstack_fabric::Access::all())
                    .with_context(|| format!("registering region {name}"))?,
            );
        }
        let stop = Arc::new(AtomicBool::new(false));
        for _ in 0..busy_threads {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x: u64 = 1;
                while !stop.load(Ordering::Relaxed) {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    std::hint::black_box(x);
                }
            });
        }
        if seq_records > 0 {
            let region = registered.first().cloned().context("--seq-records needs a --region")?;
            let records = self::seq_records(seq_records)?;
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut counter: u64 = 0;
                while !stop.load(Ordering::Relaxed) {
                    counter += 1;
                    let payload: Vec<u8> = (0..SEQ_PAYLOAD_BYTES / 8).flat_map(|_| counter.to_ne_bytes()).collect();
                    for record in &records {
                        if let Err(e) = record.write_local(region.memory(), &payload) {
                            tracing::error!(error = %e, "seqlock writer failed");
                            return;
                        }
                    }
                    // Paced, not continuous: a seqlock cannot protect a reader
                    // from a writer that never pauses (a read longer than the
                    // writer's period never succeeds). Rounds still overlap
                    // reads constantly; the readers count the versions they saw
                    // change.
                    std::thread::sleep(SEQ_WRITER_PAUSE);
                }
            });
        }
        let metrics = Arc::new(ServingMetrics {
            regions: registered.len() as u64,
            region_bytes: registered.iter().map(|r| r.memory().len()).sum(),
            messages_received: AtomicU64::new(0),
            acknowledgements: AtomicU64::new(0),
            acknowledgement_errors: AtomicU64::new(0),
        });
        let counts = metrics.clone();
        let responder_fabric = fabric.clone();
        let responder_stop = stop.clone();
        // Polls the stop flag between receives, so that on stop it lets go of
        // the fabric and dropping ours revokes the node's regions.
        let responder = std::thread::spawn(move || loop {
            if responder_stop.load(Ordering::Relaxed) {
                return;
            }
            match responder_fabric.inbox(Channel::APP).recv_timeout(RESPONDER_POLL) {
                Ok(message) => {
                    counts.messages_received.fetch_add(1, Ordering::Relaxed);
                    if message.payload.first() == Some(&1) {
                        match responder_fabric.send(message.from, Channel::APP, &[1]) {
                            Ok(()) => counts.acknowledgements.fetch_add(1, Ordering::Relaxed),
                            Err(e) => {
                                tracing::warn!(error = %e, "acknowledgement failed");
                                counts.acknowledgement_errors.fetch_add(1, Ordering::Relaxed)
                            }
                        };
                    }
                }
                Err(FabricError::RecvTimeout { .. }) => {}
                Err(_) => return,
            }
        });
        Ok(Self { fabric, registered, stop, responder, metrics })
    }

    /// Its regions and the messages it handled, for `/metrics`.
    pub fn metrics(&self) -> Arc<ServingMetrics> {
        self.metrics.clone()
    }

    /// Stops every thread, then drops the regions and the fabric (which
    /// revokes the node's regions).
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.responder.join();
        drop(self.registered);
        drop(self.fabric);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierstack_base::NodeId;
    use tierstack_cluster::{local_cluster, Backend};

    #[test]
    fn the_client_tools_report_what_they_did() {
        let cluster = local_cluster(Backend::Tcp, 2).unwrap();
        let node =
            ServingNode::start(cluster.fabric(0).clone(), &[("seq".into(), 4096), ("r".into(), 4096)], 1, 2).unwrap();
        let region = cluster.fabric(1).connect(NodeId(0), "r").unwrap();
        let region = region.as_ref();
        assert_eq!(op(region, "write-u64", 1024, 5, 0).unwrap()["result"], 5);
        assert_eq!(op(region, "fetch-add", 1024, 2, 0).unwrap()["result"], 5);
        assert_eq!(op(region, "compare-swap", 1024, 9, 7).unwrap()["result"], 7);
        assert_eq!(op(region, "read-u64", 1024, 0, 0).unwrap()["result"], 9);
        assert!(op(region, "swap", 0, 0, 0).is_err());
        let hammered = hammer(region, 1, 3, 2).unwrap();
        assert_eq!(hammered["fetch_adds"], 3);
        assert_eq!(hammered["cas_wins"], json!([1]), "round 0's word holds the fetch-adds' count");
        let seq = cluster.fabric(1).connect(NodeId(0), "seq").unwrap();
        let read = seq_read(seq.as_ref(), &seq_records(2).unwrap(), 5).unwrap();
        assert_eq!(read["reads"], 5);
        assert_eq!(read["torn"], 0);
        node.stop();
    }
}
