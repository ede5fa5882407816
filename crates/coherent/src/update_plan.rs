//! When an update's new versions become visible, and the order of the
//! module's steps around it. Pure: the module ([`crate::module`]) executes
//! these plans, and the exhaustive model checker
//! (`crates/coherent/tests/publish_model.rs`) explores every interleaving
//! of the same plans with proxies reading one-sidedly, so the ordering the
//! module runs is the ordering that was checked.
//!
//! Two modes ([`VersionsAt`], `app-module --versions-at`):
//!
//! | mode | UPDATE_PROCEED | UPDATE_DONE |
//! |---|---|---|
//! | `proceed` (the paper's) | versions := granted; reply | publish the page; reply |
//! | `done` | reply (with the versions to come) | publish the page; versions := granted; reply |
//!
//! In `proceed` mode a cached copy stops validating as soon as the update is
//! granted, before the new content exists, so from then until a new copy is
//! installed every request for the document waits for the application tier
//! (Table 1 holds its read until UPDATE_DONE). In `done` mode the proxies go
//! on serving the previous version while the update runs (allowed: the update
//! has not completed, so it is concurrent with every request that begins
//! meanwhile), and the new versions appear only once the update's page is
//! published, one one-sided read away. Either way the new versions are
//! visible before the update's reply leaves the module, so a request that
//! begins after the update completed (the updating client's own next read
//! included) can only validate the new versions.
//!
//! A granted update always gets `current + 1` for each key. One that is
//! given up before its UPDATE_DONE (revoked after the grant lifetime,
//! cancelled, or its connection closed) is *retired*: its keys go to
//! `granted + 1`, in both modes, so neither the version it was granted (its
//! holder may still publish, push or answer under it) nor the version before
//! it (the holder may have changed the data already) ever validates again.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// When an update's new versions become visible to proxies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VersionsAt {
    /// At the grant (UPDATE_PROCEED), before the new content exists: the paper's module.
    #[default]
    Proceed,
    /// At UPDATE_DONE, after the update's page is published.
    Done,
}

impl VersionsAt {
    pub fn name(self) -> &'static str {
        match self {
            VersionsAt::Proceed => "proceed",
            VersionsAt::Done => "done",
        }
    }
}

impl fmt::Display for VersionsAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for VersionsAt {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "proceed" => Ok(VersionsAt::Proceed),
            "done" => Ok(VersionsAt::Done),
            other => Err(format!("{other:?}: expected proceed or done")),
        }
    }
}

/// One step of the module's handling of an update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Write the update's page (if it brought one) into the published-pages
    /// area, with the versions it was granted.
    Publish,
    /// Store the granted versions in the version table.
    MakeVisible,
    /// Send the reply (UPDATE_PROCEED or the `done` of UPDATE_DONE).
    Reply,
}

/// The steps at the grant, in order.
pub fn grant_steps(mode: VersionsAt) -> &'static [Step] {
    match mode {
        VersionsAt::Proceed => &[Step::MakeVisible, Step::Reply],
        VersionsAt::Done => &[Step::Reply],
    }
}

/// The steps at UPDATE_DONE, in order.
pub fn done_steps(mode: VersionsAt) -> &'static [Step] {
    match mode {
        VersionsAt::Proceed => &[Step::Publish, Step::Reply],
        VersionsAt::Done => &[Step::Publish, Step::MakeVisible, Step::Reply],
    }
}

/// The version a granted update produces for a key now at `current`.
pub fn granted_version(current: u64) -> u64 {
    current.saturating_add(1)
}

/// The version a key of an update given up before its UPDATE_DONE goes to.
pub fn retired_version(granted: u64) -> u64 {
    granted.saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_modes_make_the_versions_visible_once_and_before_the_done_reply() {
        for mode in [VersionsAt::Proceed, VersionsAt::Done] {
            let all: Vec<Step> = grant_steps(mode).iter().chain(done_steps(mode)).copied().collect();
            assert_eq!(all.iter().filter(|s| **s == Step::MakeVisible).count(), 1, "{mode}");
            let visible = all.iter().position(|s| *s == Step::MakeVisible).unwrap();
            let done_reply = all.iter().rposition(|s| *s == Step::Reply).unwrap();
            assert!(visible < done_reply, "{mode}: visible before the update completes");
        }
        assert_eq!(grant_steps(VersionsAt::Done), &[Step::Reply], "done mode changes nothing at the grant");
        let done = done_steps(VersionsAt::Done);
        assert!(done.iter().position(|s| *s == Step::Publish) < done.iter().position(|s| *s == Step::MakeVisible));
    }

    #[test]
    fn modes_parse_and_print() {
        for mode in [VersionsAt::Proceed, VersionsAt::Done] {
            assert_eq!(mode.to_string().parse::<VersionsAt>(), Ok(mode));
        }
        assert!("later".parse::<VersionsAt>().is_err());
        assert_eq!(VersionsAt::default(), VersionsAt::Proceed);
        assert_eq!((granted_version(4), retired_version(5)), (5, 6));
    }
}
