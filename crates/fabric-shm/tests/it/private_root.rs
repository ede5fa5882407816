//! The shm root as a local trust boundary: created private (dirs 0700,
//! files 0600), and everything another user or a stray link could plant
//! refused with `UnsafePath`, with nothing created or read through it.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::NodeId;
use tierstack_fabric::{Access, Channel, Fabric, FabricError, PeerState};
use tierstack_fabric_shm::{ShmConfig, ShmFabric};

const BOUND: Duration = Duration::from_secs(10);
/// A uid that is not ours (`nobody`).
const STRANGER: u32 = 65534;

fn open(root: &Path, id: u32) -> Result<Arc<ShmFabric>, FabricError> {
    let nodes = (0..4).map(NodeId).collect();
    ShmFabric::open(ShmConfig::new(root, NodeId(id)).with_nodes(nodes).with_send_timeout(BOUND))
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[track_caller]
fn assert_unsafe<T>(result: Result<T, FabricError>, path_ends: &str, reason_has: &str) {
    match result {
        Err(FabricError::UnsafePath { path, reason }) => {
            assert!(path.ends_with(path_ends), "refused {path}, expected …{path_ends}");
            assert!(reason.contains(reason_has), "reason {reason:?} does not say {reason_has:?}");
        }
        Err(other) => panic!("expected UnsafePath for …{path_ends}, got {other}"),
        Ok(_) => panic!("expected UnsafePath for …{path_ends}, got Ok"),
    }
}

/// An empty directory of ours outside the root, the target of planted links.
fn decoy(dir: &Path) -> PathBuf {
    let decoy = dir.join("decoy");
    std::fs::create_dir(&decoy).unwrap();
    decoy
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

fn ring_files(node_dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(node_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("q."))
        .collect()
}

#[test]
fn created_directories_are_0700_and_files_0600() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("made/by/tierstack");
    let a = open(&root, 0).unwrap();
    let b = open(&root, 1).unwrap();
    a.register("data", 64, Access::all()).unwrap();
    b.send(NodeId(0), Channel::TEST, b"hello").unwrap();
    for made in ["made", "made/by", "made/by/tierstack", "made/by/tierstack/node-0", "made/by/tierstack/node-1"] {
        assert_eq!(mode(&dir.path().join(made)), 0o700, "{made}");
    }
    let node_0 = root.join("node-0");
    let rings = ring_files(&node_0);
    assert_eq!(rings.len(), 1);
    for file in [node_0.join("owner.pid"), node_0.join("msg.ctl"), node_0.join("r.data"), rings[0].clone()] {
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    assert_eq!(a.inbox(Channel::TEST).recv_timeout(BOUND).unwrap().payload, b"hello");
}

#[test]
fn a_symbolic_link_at_the_root_or_a_node_directory_is_refused_and_nothing_is_made_through_it() {
    let dir = tempfile::tempdir().unwrap();
    let decoy = decoy(dir.path());
    let link = dir.path().join("root-link");
    std::os::unix::fs::symlink(&decoy, &link).unwrap();
    assert_unsafe(open(&link, 0), "root-link", "symbolic link");

    let root = dir.path().join("root");
    let owner = open(&root, 0).unwrap();
    owner.register("r", 64, Access::all()).unwrap();
    std::os::unix::fs::symlink(&decoy, root.join("node-1")).unwrap();
    assert_unsafe(open(&root, 1), "node-1", "symbolic link");
    // A peer's directory planted as a link is not a peer: not connected to,
    // not sent to.
    std::os::unix::fs::symlink(root.join("node-0"), root.join("node-2")).unwrap();
    let peer = open(&root, 3).unwrap();
    assert_unsafe(peer.connect(NodeId(2), "r"), "node-2", "symbolic link");
    assert_unsafe(peer.send(NodeId(2), Channel::TEST, b"x"), "node-2", "symbolic link");
    assert_eq!(peer.peer_state(NodeId(2)), PeerState::Unknown);
    assert!(entries(&decoy).is_empty(), "something was made through a link: {:?}", entries(&decoy));
    assert!(ring_files(&root.join("node-0")).is_empty(), "a ring was made through the link");
}

#[test]
fn planted_region_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let decoy = decoy(dir.path());
    let owner = open(dir.path(), 0).unwrap();
    let peer = open(dir.path(), 1).unwrap();
    let node_0 = dir.path().join("node-0");
    // A real region's file, moved out and linked back in under another name.
    owner.register("real", 64, Access::all()).unwrap();
    let moved = decoy.join("moved");
    std::fs::rename(node_0.join("r.real"), &moved).unwrap();
    std::os::unix::fs::symlink(&moved, node_0.join("r.linked")).unwrap();
    assert_unsafe(peer.connect(NodeId(0), "linked"), "r.linked", "symbolic link");
    // A region file others may read.
    owner.register("loose", 64, Access::all()).unwrap();
    chmod(&node_0.join("r.loose"), 0o644);
    assert_unsafe(peer.connect(NodeId(0), "loose"), "r.loose", "mode 0644");
    // A hard link of a region file is not the owner's file.
    owner.register("twin", 64, Access::all()).unwrap();
    std::fs::hard_link(node_0.join("r.twin"), decoy.join("twin")).unwrap();
    assert_unsafe(peer.connect(NodeId(0), "twin"), "r.twin", "hard links");
    // A link where the owner creates a region: registration fails, and
    // the file it points to is neither truncated nor resized.
    let precious = decoy.join("precious");
    std::fs::write(&precious, b"keep me").unwrap();
    std::os::unix::fs::symlink(&precious, node_0.join(".staging.new")).unwrap();
    assert_unsafe(owner.register("new", 4096, Access::all()), ".staging.new", "already exists");
    assert_eq!(std::fs::read(&precious).unwrap(), b"keep me");
}

#[test]
fn planted_pid_and_control_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let decoy = decoy(dir.path());
    let owner = open(dir.path(), 0).unwrap();
    owner.register("r", 64, Access::all()).unwrap();
    let node_0 = dir.path().join("node-0");
    // owner.pid as a link to a file naming a live process (ours).
    let fake_pid = decoy.join("pid");
    std::fs::write(&fake_pid, std::process::id().to_string()).unwrap();
    chmod(&fake_pid, 0o600);
    std::fs::rename(node_0.join("owner.pid"), decoy.join("real-pid")).unwrap();
    std::os::unix::fs::symlink(&fake_pid, node_0.join("owner.pid")).unwrap();
    let peer = open(dir.path(), 1).unwrap();
    assert_unsafe(peer.connect(NodeId(0), "r"), "owner.pid", "symbolic link");
    assert_unsafe(peer.send(NodeId(0), Channel::TEST, b"x"), "owner.pid", "symbolic link");
    assert_eq!(peer.peer_state(NodeId(0)), PeerState::Unknown);
    // A pid file others may write.
    std::fs::remove_file(node_0.join("owner.pid")).unwrap();
    std::fs::rename(decoy.join("real-pid"), node_0.join("owner.pid")).unwrap();
    peer.connect(NodeId(0), "r").expect("the real pid file serves");
    chmod(&node_0.join("owner.pid"), 0o666);
    assert_unsafe(peer.connect(NodeId(0), "r"), "owner.pid", "mode 0666");
    chmod(&node_0.join("owner.pid"), 0o600);
    // The message control file others may read.
    chmod(&node_0.join("msg.ctl"), 0o644);
    assert_unsafe(peer.send(NodeId(0), Channel::TEST, b"x"), "msg.ctl", "mode 0644");
    // A dead node's directory with a planted pid file is not reclaimed
    // (removed) but refused.
    drop(owner);
    let stale = dir.path().join("node-2");
    std::fs::create_dir(&stale).unwrap();
    chmod(&stale, 0o700);
    std::os::unix::fs::symlink(&fake_pid, stale.join("owner.pid")).unwrap();
    assert_unsafe(open(dir.path(), 2), "owner.pid", "symbolic link");
    assert!(stale.join("owner.pid").exists());
}

#[test]
fn planted_ring_files_are_refused_and_never_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let decoy = decoy(dir.path());
    let receiver = open(dir.path(), 0).unwrap();
    let node_0 = dir.path().join("node-0");
    // Two well-formed rings, each holding a published message, made
    // untrustworthy before the receiver looks: one left readable by
    // others, one moved out and linked back in.
    let loose = open(dir.path(), 1).unwrap();
    loose.send(NodeId(0), Channel::TEST, b"from a loose ring").unwrap();
    let linked = open(dir.path(), 2).unwrap();
    let before_linked = ring_files(&node_0);
    linked.send(NodeId(0), Channel::TEST, b"from a linked ring").unwrap();
    let mut rings = ring_files(&node_0);
    rings.retain(|ring| !before_linked.contains(ring));
    assert_eq!((before_linked.len(), rings.len()), (1, 1));
    chmod(&before_linked[0], 0o644);
    let outside = decoy.join("ring");
    std::fs::rename(&rings[0], &outside).unwrap();
    std::os::unix::fs::symlink(&outside, &rings[0]).unwrap();
    // A good sender is served; the planted rings' messages never arrive.
    let good = open(dir.path(), 3).unwrap();
    good.send(NodeId(0), Channel::TEST, b"good").unwrap();
    let inbox = receiver.inbox(Channel::TEST);
    let message = inbox.recv_timeout(BOUND).unwrap();
    assert_eq!((message.from, message.payload.as_slice()), (NodeId(3), &b"good"[..]));
    good.send(NodeId(0), Channel::TEST, b"good 2").unwrap();
    assert_eq!(inbox.recv_timeout(BOUND).unwrap().payload, b"good 2");
    assert!(inbox.try_recv().is_none(), "a planted ring's message was delivered");
}

#[test]
fn a_root_open_to_others_is_refused_and_one_only_readable_is_made_private() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    for open_mode in [0o777, 0o770, 0o702, 0o1777] {
        chmod(&root, open_mode);
        assert_unsafe(open(&root, 0), "root", &format!("mode {open_mode:04o}"));
        assert!(entries(&root).is_empty(), "a node was made in a root open to others");
    }
    // Readable, not writable, by others (a directory made under umask 022):
    // ours, so made private.
    chmod(&root, 0o755);
    let node = open(&root, 0).unwrap();
    assert_eq!(mode(&root), 0o700);
    drop(node);
    // An ancestor others may write without the sticky bit (not /tmp's
    // 1777): another user could swap the root for one of theirs.
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o777);
    assert_unsafe(open(&shared.join("root"), 0), "shared/root", "writable by others without the sticky bit");
    assert!(entries(&shared).is_empty());
}

/// Changes the owner of `path` to `uid`, or says why it cannot (not root).
fn give_away(path: &Path, uid: u32) -> bool {
    match std::os::unix::fs::chown(path, Some(uid), None) {
        Ok(()) => true,
        Err(e) => {
            println!("skipped: cannot give {} to uid {uid} ({e}); run as root to test a foreign owner", path.display());
            false
        }
    }
}

#[test]
fn a_root_or_node_directory_owned_by_another_user_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    chmod(&root, 0o700);
    if !give_away(&root, STRANGER) {
        return;
    }
    assert_unsafe(open(&root, 0), "root", &format!("owned by uid {STRANGER}"));
    assert!(entries(&root).is_empty());
    // Under a foreign-owned (but closed) ancestor.
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    chmod(&theirs, 0o755);
    assert!(give_away(&theirs, STRANGER));
    assert_unsafe(open(&theirs.join("root"), 0), "theirs/root", &format!("owned by uid {STRANGER}"));
    // A node directory planted by another user in our root.
    let ours = dir.path().join("ours");
    let owner = open(&ours, 0).unwrap();
    owner.register("r", 64, Access::all()).unwrap();
    let planted = ours.join("node-1");
    std::fs::create_dir(&planted).unwrap();
    chmod(&planted, 0o700);
    assert!(give_away(&planted, STRANGER));
    assert_unsafe(open(&ours, 1), "node-1", &format!("owned by uid {STRANGER}"));
    assert!(planted.exists(), "another user's directory was removed");
    // A region file another user owns.
    let file = ours.join("node-0").join("r.r");
    assert!(give_away(&file, STRANGER));
    let peer = open(&ours, 2).unwrap();
    assert_unsafe(peer.connect(NodeId(0), "r"), "r.r", &format!("owned by uid {STRANGER}"));
}
