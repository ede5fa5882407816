//! How the monitor's types are written as command-line words: each
//! `Display` here round-trips through the matching `FromStr`, so a
//! launcher spells a flag's value the way the parser reads it.

use crate::{BackendAddress, Policy};
use std::fmt;
use std::net::SocketAddr;
use tierstack_base::NodeId;

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for BackendAddress {
    type Err = String;

    /// `<fabric node>@<socket address>`, either part possibly empty.
    fn from_str(text: &str) -> Result<Self, String> {
        let (node, socket) = text.split_once('@').ok_or_else(|| format!("{text:?}: expected <node>@<socket>"))?;
        let node = match node {
            "" => None,
            node => Some(NodeId(node.parse::<u32>().map_err(|_| format!("{text:?}: {node:?} is not a node id"))?)),
        };
        let socket = match socket {
            "" => None,
            socket => Some(socket.parse::<SocketAddr>().map_err(|_| format!("{text:?}: {socket:?} is not host:port"))?),
        };
        Ok(BackendAddress { node, socket })
    }
}

impl fmt::Display for BackendAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(node) = self.node {
            write!(f, "{}", node.0)?;
        }
        f.write_str("@")?;
        if let Some(socket) = self.socket {
            write!(f, "{socket}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Scheme;

    #[test]
    fn words_round_trip() {
        for policy in [Policy::Hash, Policy::RoundRobin, Policy::LeastLoaded] {
            assert_eq!(policy.to_string().parse::<Policy>().unwrap(), policy);
        }
        for scheme in [Scheme::SocketAsync, Scheme::SocketSync, Scheme::RdmaAsync, Scheme::RdmaSync] {
            assert_eq!(scheme.to_string().parse::<Scheme>().unwrap(), scheme);
        }
        for text in ["3@", "@127.0.0.1:9101", "4@127.0.0.1:9102", "@"] {
            let address: BackendAddress = text.parse().unwrap();
            assert_eq!(address.to_string(), text);
            assert_eq!(address.to_string().parse::<BackendAddress>().unwrap(), address);
        }
        assert!("3".parse::<BackendAddress>().is_err());
    }
}
