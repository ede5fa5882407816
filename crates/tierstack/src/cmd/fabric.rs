//! `tierstack fabric …`: a node that serves regions, and clients that operate
//! on them. The multi-process tests and `bench fabric` drive these.

use super::NodeArgs;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::json;
use std::io::BufRead;
use std::sync::Arc;
use tierstack_base::NodeId;
use tierstack_fabric::seqlock::SeqRecord;
use tierstack_fabric::Channel;

#[derive(Args)]
pub(crate) struct TargetArgs {
    /// The node that owns the region.
    #[arg(long)]
    target: u32,
    /// The region's name.
    #[arg(long)]
    region: String,
}

#[derive(Subcommand)]
pub(crate) enum FabricCommand {
    /// Register regions and serve them until standard input closes.
    /// Prints `ready` once the regions exist. Answers messages whose first
    /// byte is 1 with a one-byte message (an acknowledgement for benchmarks).
    Serve {
        #[command(flatten)]
        node: NodeArgs,
        /// A region to register, as NAME:BYTES (repeatable).
        #[arg(long = "region", value_parser = parse_region)]
        regions: Vec<(String, u64)>,
        /// CPU-burning threads to run in this process (owner load).
        #[arg(long, default_value_t = 0)]
        busy_threads: usize,
        /// Rewrite K seqlock records at the start of the first region
        /// continuously (all payload words equal), for torn-read stress tests.
        #[arg(long, default_value_t = 0)]
        seq_records: u32,
        #[command(flatten)]
        service: crate::service::ServiceArgs,
    },
    /// Perform one operation and print its result as JSON.
    Op {
        #[command(flatten)]
        node: NodeArgs,
        #[command(flatten)]
        target: TargetArgs,
        #[arg(long, value_parser = ["read-u64", "write-u64", "fetch-add", "compare-swap"])]
        op: String,
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Value to write or add, or the new value of a compare-swap.
        #[arg(long, default_value_t = 0)]
        value: u64,
        #[arg(long, default_value_t = 0)]
        expected: u64,
    },
    /// Contend on a region: COUNT fetch_adds of 1 on offset 0, or ROUNDS
    /// compare_swap rounds (round r tries word r from 0 to node+1). Prints JSON.
    Hammer {
        #[command(flatten)]
        node: NodeArgs,
        #[command(flatten)]
        target: TargetArgs,
        #[arg(long, default_value_t = 0)]
        fetch_adds: u64,
        #[arg(long, default_value_t = 0)]
        cas_rounds: u64,
        /// Wait for a line on standard input before starting, so that all
        /// contenders start together.
        #[arg(long)]
        wait_go: bool,
    },
    /// Read K seqlock records READS times, check each is untorn, print JSON
    /// (after a `ready` line).
    SeqRead {
        #[command(flatten)]
        node: NodeArgs,
        #[command(flatten)]
        target: TargetArgs,
        #[arg(long)]
        records: u32,
        #[arg(long)]
        reads: u64,
    },
}

fn parse_region(s: &str) -> Result<(String, u64), String> {
    let (name, bytes) = s.split_once(':').ok_or_else(|| format!("expected NAME:BYTES, got {s:?}"))?;
    let bytes = bytes.parse::<u64>().map_err(|e| format!("bad size in {s:?}: {e}"))?;
    Ok((name.to_string(), bytes))
}

/// Pause between the stress writer's rounds.
const SEQ_WRITER_PAUSE: std::time::Duration = std::time::Duration::from_micros(20);

/// Payload size of the stress records: several words, so tearing is possible.
pub(crate) const SEQ_PAYLOAD_BYTES: u32 = 64;

fn seq_record(index: u32) -> Result<SeqRecord> {
    let footprint = 8 + u64::from(SEQ_PAYLOAD_BYTES);
    Ok(SeqRecord::new(u64::from(index) * footprint, SEQ_PAYLOAD_BYTES)?)
}

pub(crate) fn run(command: FabricCommand) -> Result<()> {
    match command {
        FabricCommand::Serve { node, regions, busy_threads, seq_records, service } => {
            serve(&node, &regions, busy_threads, seq_records, &service)
        }
        FabricCommand::Op { node, target, op, offset, value, expected } => {
            let (_, fabric) = node.open()?;
            let region = fabric.connect(NodeId(target.target), &target.region)?;
            let result = match op.as_str() {
                "read-u64" => region.read_u64(offset)?,
                "write-u64" => {
                    region.write(offset, &value.to_ne_bytes())?;
                    value
                }
                "fetch-add" => region.fetch_add(offset, value)?,
                "compare-swap" => region.compare_swap(offset, expected, value)?,
                other => bail!("unknown op {other}"),
            };
            println!("{}", json!({ "op": op, "offset": offset, "result": result }));
            Ok(())
        }
        FabricCommand::Hammer { node, target, fetch_adds, cas_rounds, wait_go } => {
            let (_, fabric) = node.open()?;
            let region = fabric.connect(NodeId(target.target), &target.region)?;
            crate::service::announce_ready()?;
            if wait_go {
                let mut line = String::new();
                std::io::stdin().lock().read_line(&mut line)?;
            }
            for _ in 0..fetch_adds {
                region.fetch_add(0, 1)?;
            }
            let mut wins = Vec::new();
            for round in 0..cas_rounds {
                let previous = region.compare_swap(8 * round, 0, u64::from(node.node) + 1)?;
                if previous == 0 {
                    wins.push(round);
                }
            }
            println!("{}", json!({ "node": node.node, "fetch_adds": fetch_adds, "cas_wins": wins }));
            Ok(())
        }
        FabricCommand::SeqRead { node, target, records, reads } => {
            let (_, fabric) = node.open()?;
            let region = fabric.connect(NodeId(target.target), &target.region)?;
            let records: Vec<SeqRecord> = (0..records).map(seq_record).collect::<Result<_>>()?;
            crate::service::announce_ready()?;
            let (mut torn, mut versions_seen_changing, mut last_version) = (0u64, 0u64, 0u64);
            for _ in 0..reads {
                for (version, payload) in tierstack_fabric::seqlock::read_many(region.as_ref(), &records)? {
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
            println!("{}", json!({ "reads": reads, "torn": torn, "version_changes": versions_seen_changing }));
            Ok(())
        }
    }
}

/// How long `fabric serve`'s responder waits for a message before it
/// looks at the stop flag again.
const RESPONDER_POLL: std::time::Duration = std::time::Duration::from_millis(100);

fn serve(
    node: &NodeArgs,
    regions: &[(String, u64)],
    busy_threads: usize,
    seq_records: u32,
    service: &crate::service::ServiceArgs,
) -> Result<()> {
    let (_, fabric) = node.open()?;
    let mut registered = Vec::new();
    for (name, bytes) in regions {
        registered.push(fabric.register(name, *bytes).with_context(|| format!("registering region {name}"))?);
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for _ in 0..busy_threads {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut x: u64 = 1;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                std::hint::black_box(x);
            }
        });
    }
    if seq_records > 0 {
        let region = registered.first().cloned().context("--seq-records needs a --region")?;
        let records: Vec<SeqRecord> = (0..seq_records).map(seq_record).collect::<Result<_>>()?;
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut counter: u64 = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
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
    let responder_fabric = fabric.clone();
    let responder_stop = stop.clone();
    // Polls the stop flag between receives, so that on stop it lets go of
    // the fabric and dropping ours revokes the node's regions.
    let responder = std::thread::spawn(move || loop {
        if responder_stop.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        match responder_fabric.inbox(Channel::APP).recv_timeout(RESPONDER_POLL) {
            Ok(message) => {
                if message.payload.first() == Some(&1) {
                    if let Err(e) = responder_fabric.send(message.from, Channel::APP, &[1]) {
                        tracing::warn!(error = %e, "acknowledgement failed");
                    }
                }
            }
            Err(tierstack_fabric::FabricError::RecvTimeout { .. }) => {}
            Err(_) => return,
        }
    });
    let stopped = service.stop_watch_thread()?;
    crate::service::announce_ready()?;
    let _ = stopped.recv();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = responder.join();
    drop(registered);
    drop(fabric);
    Ok(())
}
