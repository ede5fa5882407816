//! Publishing pages with updates (issue 31) through the module's socket,
//! read back by a proxy node's checker one-sidedly, on shm and tcp: the
//! `done` mode's versions change at UPDATE_DONE and the page is current
//! right after; the `proceed` mode publishes too; pages that cannot be
//! published do not fail their update; given-up updates retire their
//! versions; a record evicted by another key's page is not served.

use crate::module::{bounded, connect, keys, runtime};
use std::sync::Arc;
use std::time::Duration;
use tierstack_cluster::{local_cluster, Backend, LocalCluster};
use tierstack_coherent::module::{ModuleClient, ModuleOptions, ModuleServer};
use tierstack_coherent::pages::PageMiss;
use tierstack_coherent::version_table::{Incarnation, PagesConfig, VersionChecker, VersionTable};
use tierstack_coherent::{DepsHeader, Page, VersionsAt};

struct Setup {
    cluster: LocalCluster,
    server: Arc<ModuleServer>,
    socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn setup(backend: Backend, versions_at: VersionsAt, pages: PagesConfig, lifetime: Option<Duration>) -> Setup {
    let cluster = local_cluster(backend, 2).unwrap();
    let table = Arc::new(
        VersionTable::create_with_pages(cluster.fabric(0).as_ref(), 1024, pages, Incarnation(0x9a9e)).unwrap(),
    );
    let options = ModuleOptions { versions_at, grant_lifetime: lifetime, ..ModuleOptions::default() };
    let server = Arc::new(ModuleServer::with_options(table, &options).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("module.sock");
    Setup { cluster, server, socket, _dir: dir }
}

impl Setup {
    fn serve(&self) {
        let serving = self.server.clone();
        let path = self.socket.clone();
        tokio::spawn(async move { serving.serve(&path).await });
    }

    fn checker(&self) -> VersionChecker {
        VersionChecker::new(self.cluster.fabric(1).clone())
    }
}

fn page(path: &str, body: &[u8]) -> Page {
    Page::with_body(path, vec![("content-type".into(), "text/plain".into())], body)
}

/// The versions a read of `key` is granted now (read and given back).
async fn current(client: &ModuleClient, key: &str) -> DepsHeader {
    let read = client.read(&keys(&[key])).await.unwrap();
    let header = DepsHeader::parse(&read.deps).unwrap();
    client.read_done(read).await.unwrap();
    header
}

fn version(deps: &str) -> u64 {
    DepsHeader::parse(deps).unwrap().deps[0].version
}

#[test]
fn in_done_mode_versions_change_at_update_done_and_the_page_is_current_right_after() {
    for backend in [Backend::Shm, Backend::Tcp] {
        let s = setup(backend, VersionsAt::Done, PagesConfig::DEFAULT, None);
        let checker = s.checker();
        runtime().block_on(async {
            s.serve();
            let client = connect(&s.socket).await;
            let old = current(&client, "doc/a").await;
            assert_eq!(checker.published_page(&old, "/doc/a", 64).await.unwrap(), Err(PageMiss::Absent));

            let update = client.update(&keys(&["doc/a"])).await.unwrap();
            assert!(update.visible_at_done, "{}: done mode says so at the grant", backend.name());
            assert_eq!(version(&update.deps), 2, "the version the update produces");
            // The update runs: proxies go on validating the previous version.
            assert!(checker.is_current(&old).await.unwrap(), "{}: old copy current during the update", backend.name());
            let produced = update.deps.clone();
            let done = client.update_done_with_page(update, Some(page("/doc/a", b"new body"))).await.unwrap();
            assert_eq!((done.deps.as_str(), done.published.clone()), (produced.as_str(), Some(Ok(()))));
            assert!(!checker.is_current(&old).await.unwrap(), "{}: visible once done", backend.name());

            // One one-sided read finds the page, at the versions now current.
            let found = checker.published_page(&old, "/doc/a", 16).await.unwrap().unwrap();
            assert_eq!(found.page.body, b"new body");
            assert_eq!(found.page.deps, produced);
            assert_eq!(found.page.headers, vec![("content-type".to_string(), "text/plain".to_string())]);
            assert!(checker.is_current(&found.deps).await.unwrap());
            // Not for another path, and not once a later update changed the versions.
            assert_eq!(checker.published_page(&old, "/doc/b", 64).await.unwrap(), Err(PageMiss::Absent));
            let next = client.update(&keys(&["doc/a"])).await.unwrap();
            client.update_done(next).await.unwrap();
            assert_eq!(checker.published_page(&old, "/doc/a", 64).await.unwrap(), Err(PageMiss::Changed));
            // A read granted after the update sees its versions.
            let read = client.read(&keys(&["doc/a"])).await.unwrap();
            assert_eq!(version(&read.deps), 3);
            client.read_done(read).await.unwrap();
            assert_eq!((s.server.pages_published(), s.server.pages_unpublished()), (1, 0));
        });
    }
}

#[test]
fn in_proceed_mode_versions_change_at_the_grant_and_the_page_is_published_at_done() {
    let s = setup(Backend::Shm, VersionsAt::Proceed, PagesConfig::DEFAULT, None);
    let checker = s.checker();
    runtime().block_on(async {
        s.serve();
        let client = connect(&s.socket).await;
        let old = current(&client, "doc/a").await;
        let update = client.update(&keys(&["doc/a"])).await.unwrap();
        assert!(!update.visible_at_done);
        assert!(!checker.is_current(&old).await.unwrap(), "proceed mode: visible at the grant");
        assert_eq!(checker.published_page(&old, "/doc/a", 64).await.unwrap(), Err(PageMiss::Absent));
        let done = client.update_done_with_page(update, Some(page("/doc/a", b"v2"))).await.unwrap();
        assert_eq!(done.published, Some(Ok(())));
        let found = checker.published_page(&old, "/doc/a", 64).await.unwrap().unwrap();
        assert_eq!(found.page.body, b"v2");
    });
}

#[test]
fn a_page_that_cannot_be_published_does_not_fail_its_update() {
    let small = PagesConfig { count: 4, page_bytes: 256 };
    let s = setup(Backend::Shm, VersionsAt::Done, small, None);
    let checker = s.checker();
    runtime().block_on(async {
        s.serve();
        let client = connect(&s.socket).await;
        let old = current(&client, "doc/a").await;
        for (bad, why) in [
            (page("/doc/a", &[7; 300]), "holds at most"),
            (Page { path: "no-slash".into(), ..Page::default() }, "must start with"),
            (Page { headers: vec![("content-length".into(), "3".into())], ..page("/doc/a", b"x") }, "set by the proxy"),
        ] {
            let update = client.update(&keys(&["doc/a"])).await.unwrap();
            let produced = update.deps.clone();
            let done = client.update_done_with_page(update, Some(bad)).await.unwrap();
            assert_eq!(done.deps, produced, "the update completed");
            let refused = done.published.unwrap().unwrap_err();
            assert!(refused.contains(why), "{refused}");
        }
        assert_eq!(
            checker.published_page(&old, "/doc/a", 64).await.unwrap(),
            Err(PageMiss::Absent),
            "nothing was published"
        );
        assert_eq!((s.server.pages_published(), s.server.pages_unpublished()), (0, 3));
        // A module without an area says so.
        let none = setup(Backend::Shm, VersionsAt::Done, PagesConfig::NONE, None);
        none.serve();
        let client = connect(&none.socket).await;
        let update = client.update(&keys(&["doc/a"])).await.unwrap();
        let done = client.update_done_with_page(update, Some(page("/doc/a", b"x"))).await.unwrap();
        assert!(done.published.unwrap().unwrap_err().contains("publishes no pages"));
        let header = DepsHeader::parse(&done.deps).unwrap();
        assert_eq!(none.checker().published_page(&header, "/doc/a", 64).await.unwrap(), Err(PageMiss::NoArea));
    });
}

#[test]
fn an_update_given_up_retires_the_version_it_was_granted_in_both_modes() {
    for versions_at in [VersionsAt::Proceed, VersionsAt::Done] {
        let s = setup(Backend::Shm, versions_at, PagesConfig::DEFAULT, Some(Duration::from_millis(50)));
        runtime().block_on(async {
            s.serve();
            let client = connect(&s.socket).await;
            let slot = s.server.table().slot_of("doc/a").unwrap();
            let _ = &client;
            // Given up after its grant: its connection closes.
            let quitter = connect(&s.socket).await;
            let update = quitter.update(&keys(&["doc/a"])).await.unwrap();
            assert_eq!(version(&update.deps), 2);
            drop((update, quitter));
            let deadline = tierstack_base::time::instant_now() + Duration::from_secs(30);
            while s.server.table().version(slot).unwrap() != 3 {
                assert!(
                    tierstack_base::time::instant_now() < deadline,
                    "{versions_at}: the closed update never retired"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let holder = connect(&s.socket).await;
            // Revoked after the grant lifetime: its holder never finishes.
            let stuck = holder.update(&keys(&["doc/a"])).await.unwrap();
            let granted = version(&stuck.deps);
            let deadline = tierstack_base::time::instant_now() + Duration::from_secs(30);
            while s.server.grants_revoked() == 0 {
                assert!(tierstack_base::time::instant_now() < deadline, "never revoked");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let now = s.server.table().version(slot).unwrap();
            assert_eq!(now, granted + 1, "{versions_at}: neither the granted version nor an older one validates");
            assert!(holder.update_done(stuck).await.is_err(), "a revoked update's DONE is refused");
            // The next update produces a version nobody produced before.
            let next = bounded(client.update(&keys(&["doc/a"]))).await.unwrap();
            assert_eq!(version(&next.deps), now + 1);
            client.update_done(next).await.unwrap();
        });
    }
}

#[test]
fn a_page_evicted_by_another_keys_page_is_not_served() {
    // Two records: slots 0 and 2 share record 0.
    let s = setup(Backend::Shm, VersionsAt::Done, PagesConfig { count: 2, page_bytes: 4096 }, None);
    let checker = s.checker();
    runtime().block_on(async {
        s.serve();
        let client = connect(&s.socket).await;
        for key in ["doc/a", "doc/b", "doc/c"] {
            s.server.table().slot_of(key).unwrap();
        }
        let old = current(&client, "doc/a").await;
        let update = client.update(&keys(&["doc/a"])).await.unwrap();
        client.update_done_with_page(update, Some(page("/doc/a", b"a2"))).await.unwrap();
        assert!(checker.published_page(&old, "/doc/a", 64).await.unwrap().is_ok());
        let update = client.update(&keys(&["doc/c"])).await.unwrap();
        client.update_done_with_page(update, Some(page("/doc/c", b"c2"))).await.unwrap();
        assert_eq!(checker.published_page(&old, "/doc/a", 64).await.unwrap(), Err(PageMiss::Absent), "evicted");
    });
}
