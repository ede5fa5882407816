//! The flags a proxy's `--coop` mode shares with `tierstack coop-node`,
//! spelled once: both parsers flatten [`CoopArgs`], a launcher spells them
//! with [`CoopArgs::to_args`].

use crate::{Scheme, HYBCC_SMALL_MAX_BYTES};

/// Bytes a pooled response takes beyond its body, at most, in the
/// threshold's sense (its stored head and the envelope's key).
pub const HEAD_ALLOWANCE_BYTES: u64 = 1024;

/// Each node's pool unless told otherwise (the paper's 64 MB per node).
pub const POOL_BYTES_DEFAULT: u64 = 64 << 20;

/// `--coop-ack-timeout-ms` unless told otherwise.
pub const ACK_TIMEOUT_MS_DEFAULT: u64 = 500;

/// `--coop-key-table-entries` unless told otherwise: room for every entity
/// of four 64 MB pools of 4 KiB entities homed at one node.
pub const KEY_TABLE_ENTRIES_DEFAULT: u64 = 1 << 16;

/// `--coop-liveness-ms` unless told otherwise: on tcp each poll of a peer
/// is a connection (a responder thread at the peer), so not much more often.
pub const LIVENESS_MS_DEFAULT: u64 = 500;

/// A scheme's name on the command line (the word [`Scheme::name`] writes;
/// HYBCC's threshold is a flag of its own, `--coop-hybcc-small-max`).
pub fn parse_scheme(s: &str) -> Result<Scheme, String> {
    s.parse::<Scheme>().map_err(|e| e.to_string())
}

/// Who cooperates, and with how much memory (the same on every node).
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct CoopArgs {
    /// The cooperating proxies' fabric nodes, in order (comma-separated);
    /// default: every `proxy` node of the topology.
    #[arg(long = "coop-peers", value_delimiter = ',')]
    pub peers: Vec<u32>,
    /// The passive back-end memory nodes (MTACC, HYBCC); default: every
    /// `passive` node of the topology.
    #[arg(long = "coop-passive", value_delimiter = ',')]
    pub passive: Vec<u32>,
    /// Each node's pool (the paper's 64 MB per node).
    #[arg(long = "coop-pool-bytes", default_value_t = POOL_BYTES_DEFAULT)]
    pub pool_bytes: u64,
    /// How long a node waits for a peer's answer (STORE acknowledgment,
    /// groupcache reply, a home's grant) before it counts a miss.
    #[arg(long = "coop-ack-timeout-ms", default_value_t = ACK_TIMEOUT_MS_DEFAULT)]
    pub ack_timeout_ms: u64,
    /// HYBCC: the largest pooled entity treated as small (BCC on the
    /// proxies). The pool holds the response head with the body, so the
    /// default is the seed-notes' 8 KiB plus 1 KiB for the head: an 8 KiB
    /// file is small.
    #[arg(long = "coop-hybcc-small-max", default_value_t = HYBCC_SMALL_MAX_BYTES + HEAD_ALLOWANCE_BYTES)]
    pub hybcc_small_max: u64,
    /// Entries of each home's key table (a power of two, at most 2^24). An
    /// entry lives while some node holds a copy of its key; a key whose
    /// probe window is full is not pooled (its copy is dropped at once,
    /// counted as `pool_refusals`), so a purge never misses a copy.
    #[arg(long = "coop-key-table-entries", default_value_t = KEY_TABLE_ENTRIES_DEFAULT)]
    pub key_table_entries: u64,
    /// How often a node asks the fabric whether its peers live; a home found
    /// gone is taken over by its ring successor.
    #[arg(long = "coop-liveness-ms", default_value_t = LIVENESS_MS_DEFAULT)]
    pub liveness_ms: u64,
}

impl Default for CoopArgs {
    /// As parsed from no flags.
    fn default() -> Self {
        CoopArgs {
            peers: Vec::new(),
            passive: Vec::new(),
            pool_bytes: POOL_BYTES_DEFAULT,
            ack_timeout_ms: ACK_TIMEOUT_MS_DEFAULT,
            hybcc_small_max: HYBCC_SMALL_MAX_BYTES + HEAD_ALLOWANCE_BYTES,
            key_table_entries: KEY_TABLE_ENTRIES_DEFAULT,
            liveness_ms: LIVENESS_MS_DEFAULT,
        }
    }
}

impl CoopArgs {
    /// The command-line words that parse back into these arguments: each
    /// flag whose value is not the parser's default (none for `Default`).
    pub fn to_args(&self) -> Vec<String> {
        let default = CoopArgs::default();
        let list = |nodes: &[u32]| nodes.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let mut args = Vec::new();
        let mut flag = |name: &str, value: String| args.extend([name.to_string(), value]);
        if !self.peers.is_empty() {
            flag("--coop-peers", list(&self.peers));
        }
        if !self.passive.is_empty() {
            flag("--coop-passive", list(&self.passive));
        }
        if self.pool_bytes != default.pool_bytes {
            flag("--coop-pool-bytes", self.pool_bytes.to_string());
        }
        if self.ack_timeout_ms != default.ack_timeout_ms {
            flag("--coop-ack-timeout-ms", self.ack_timeout_ms.to_string());
        }
        if self.hybcc_small_max != default.hybcc_small_max {
            flag("--coop-hybcc-small-max", self.hybcc_small_max.to_string());
        }
        if self.key_table_entries != default.key_table_entries {
            flag("--coop-key-table-entries", self.key_table_entries.to_string());
        }
        if self.liveness_ms != default.liveness_ms {
            flag("--coop-liveness-ms", self.liveness_ms.to_string());
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &CoopArgs) -> CoopArgs {
        let words = std::iter::once("coop-node".to_string()).chain(args.to_args());
        tierstack_testkit::args::parse::<CoopArgs, _, _>(words).unwrap()
    }

    /// Guards "spelled once": every field, at a value other than its
    /// default, survives `to_args` and parsing.
    #[test]
    fn coop_args_round_trip_through_their_words() {
        let args = CoopArgs {
            peers: vec![1, 2, 3],
            passive: vec![5],
            pool_bytes: 4096,
            ack_timeout_ms: 9,
            hybcc_small_max: 100,
            key_table_entries: 1 << 10,
            liveness_ms: 7,
        };
        assert_eq!(parse(&args), args);
    }

    /// `Default` agrees with the parser's defaults.
    #[test]
    fn default_has_the_parsers_defaults() {
        let parsed = tierstack_testkit::args::parse::<CoopArgs, _, _>(["coop-node"]).unwrap();
        assert_eq!(parsed, CoopArgs::default());
        assert_eq!(parse(&parsed), parsed);
    }

    /// Every scheme's name parses back into it (HYBCC at its default threshold).
    #[test]
    fn scheme_names_round_trip() {
        for name in Scheme::NAMES {
            assert_eq!(parse_scheme(name).unwrap().name(), name);
        }
    }
}
