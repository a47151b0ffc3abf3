//! The etcd registry store against a real etcd (scripts/setup.sh installs it): documents and
//! revisions, watch order, compaction, and what a node sees while etcd is down and after it
//! comes back.

use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use quiver::registry::{
    DocFormat, DocKind, Registry, RegistryStore, Severity, StoreError, StoreEvent, StoredDoc,
    Write, check_changes,
};
use quiver_node::EtcdStore;
use quiver_node::defaults::{ETCD_KEEPALIVE_INTERVAL, ETCD_KEEPALIVE_TIMEOUT};
use quiver_tests::etcd::Etcd;

/// Generous: several engineers build on two cores.
const EVENT_WITHIN: Duration = Duration::from_secs(15);

fn server(id: &str, command: &str) -> Vec<u8> {
    format!("server_id = \"{id}\"\ntransport = \"stdio\"\n\n[stdio]\ncommand = \"{command}\"\n")
        .into_bytes()
}

async fn store(etcd: &Etcd) -> EtcdStore {
    EtcdStore::connect(vec![etcd.endpoint()], "quiver".into())
        .await
        .expect("connect")
}

async fn next(
    stream: &mut BoxStream<'static, Result<StoreEvent, StoreError>>,
) -> Result<StoreEvent, StoreError> {
    tokio::time::timeout(EVENT_WITHIN, stream.next())
        .await
        .expect("a watch event in time")
        .expect("the watch stream ended without an error")
}

fn put_of(event: Result<StoreEvent, StoreError>) -> StoredDoc {
    match event {
        Ok(StoreEvent::Put(doc)) => doc,
        other => panic!("expected a put, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_round_trip_with_increasing_revisions() {
    let etcd = Etcd::start();
    let store = store(&etcd).await;
    assert!(
        store.describe().starts_with("etcd://127.0.0.1:"),
        "{}",
        store.describe()
    );

    let empty = store.list().await.expect("list");
    assert!(empty.docs.is_empty());

    let r1 = store
        .upsert(
            DocKind::Server,
            "alpha",
            DocFormat::Toml,
            server("alpha", "a"),
        )
        .await
        .expect("upsert alpha");
    assert!(r1 > empty.revision);
    let doc = store.get(DocKind::Server, "alpha").await.unwrap().unwrap();
    assert_eq!(
        (doc.format, doc.body.clone(), doc.revision),
        (DocFormat::Toml, server("alpha", "a"), r1)
    );

    let profile = br#"{"server_ids":["alpha"]}"#.to_vec();
    let r2 = store
        .upsert(DocKind::Profile, "dev", DocFormat::Json, profile.clone())
        .await
        .expect("upsert profile");
    assert!(r2 > r1);
    let r3 = store
        .upsert(
            DocKind::Server,
            "alpha",
            DocFormat::Toml,
            server("alpha", "b"),
        )
        .await
        .expect("update alpha");
    assert!(r3 > r2);

    let listing = store.list().await.expect("list");
    assert_eq!(listing.revision, r3);
    let mut docs: Vec<_> = listing
        .docs
        .iter()
        .map(|d| (d.kind, d.name.as_str(), d.revision, d.body.clone()))
        .collect();
    docs.sort();
    assert_eq!(
        docs,
        vec![
            (DocKind::Server, "alpha", r3, server("alpha", "b")),
            (DocKind::Profile, "dev", r2, profile),
        ]
    );

    // Refused before anything is written: the revision stays.
    let err = store
        .upsert(
            DocKind::Server,
            "alpha",
            DocFormat::Toml,
            server("beta", "b"),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Invalid(m) if m.contains("server_id")),
        "{err:?}"
    );
    for (name, body) in [
        ("alpha", b"server_id = ".to_vec()),
        ("bad/name", server("bad/name", "x")),
        ("alpha", vec![b'#'; 300 * 1024]),
    ] {
        let err = store
            .upsert(DocKind::Server, name, DocFormat::Toml, body)
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Invalid(_)), "{name}: {err:?}");
    }
    assert_eq!(store.list().await.unwrap().revision, r3);

    let r4 = store
        .delete(DocKind::Server, "alpha")
        .await
        .expect("delete")
        .expect("alpha existed");
    assert!(r4 > r3);
    assert_eq!(store.delete(DocKind::Server, "alpha").await.unwrap(), None);
    assert_eq!(store.get(DocKind::Server, "alpha").await.unwrap(), None);
    let listing = store.list().await.unwrap();
    assert_eq!((listing.revision, listing.docs.len()), (r4, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_replays_and_follows_changes_in_order() {
    let etcd = Etcd::start();
    let store = store(&etcd).await;
    let since = store
        .upsert(DocKind::Server, "old", DocFormat::Toml, server("old", "o"))
        .await
        .unwrap();
    let ra = store
        .upsert(DocKind::Server, "a", DocFormat::Toml, server("a", "a"))
        .await
        .unwrap();
    // A key under the prefix that is not a document (written by hand) is not an event.
    let mut raw = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .unwrap();
    raw.put("/quiver/notes/readme", "hand-written", None)
        .await
        .unwrap();
    let rdel = store.delete(DocKind::Server, "old").await.unwrap().unwrap();

    let mut watch = store.watch(since).await.expect("watch");
    let a = put_of(next(&mut watch).await);
    assert_eq!(
        (a.name.as_str(), a.revision, a.body),
        ("a", ra, server("a", "a"))
    );
    assert_eq!(
        next(&mut watch).await,
        Ok(StoreEvent::Deleted {
            kind: DocKind::Server,
            name: "old".into(),
            revision: rdel
        })
    );

    // Live changes after the replay.
    let rp = store
        .upsert(DocKind::Profile, "p", DocFormat::Json, b"{}".to_vec())
        .await
        .unwrap();
    let p = put_of(next(&mut watch).await);
    assert_eq!(
        (p.kind, p.name.as_str(), p.revision),
        (DocKind::Profile, "p", rp)
    );
    // A value that is not a document reads as a deletion, as a listing leaves it out.
    raw.put("/quiver/servers/a", "not an envelope", None)
        .await
        .unwrap();
    assert!(matches!(
        next(&mut watch).await,
        Ok(StoreEvent::Deleted { kind: DocKind::Server, ref name, .. }) if name == "a"
    ));
    assert!(store.get(DocKind::Server, "a").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_a_compacted_revision_says_compacted() {
    let etcd = Etcd::start();
    let store = store(&etcd).await;
    let since = store
        .upsert(DocKind::Server, "x", DocFormat::Toml, server("x", "1"))
        .await
        .unwrap();
    for n in 2..5 {
        store
            .upsert(
                DocKind::Server,
                "x",
                DocFormat::Toml,
                server("x", &n.to_string()),
            )
            .await
            .unwrap();
    }
    let now = store.list().await.unwrap().revision;
    let mut raw = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .unwrap();
    raw.compact(i64::try_from(now).unwrap(), None)
        .await
        .unwrap();

    let mut watch = store.watch(since).await.expect("open the watch");
    let err = next(&mut watch).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Compacted { revision, .. } if revision == since),
        "{err:?}"
    );
    assert!(
        tokio::time::timeout(EVENT_WITHIN, watch.next())
            .await
            .expect("the stream ends after the error")
            .is_none()
    );
    // From the current revision the watch works.
    let mut watch = store.watch(now).await.unwrap();
    let r = store
        .upsert(DocKind::Server, "x", DocFormat::Toml, server("x", "5"))
        .await
        .unwrap();
    assert_eq!(put_of(next(&mut watch).await).revision, r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_down_means_unreachable_in_time_and_back_means_working() {
    let mut etcd = Etcd::start();
    let timeout = Duration::from_secs(2);
    let store = store(&etcd).await.with_timeout(timeout);
    let r = store
        .upsert(
            DocKind::Server,
            "kept",
            DocFormat::Toml,
            server("kept", "k"),
        )
        .await
        .unwrap();
    let mut watch = store.watch(r).await.unwrap();

    etcd.stop();
    let err = next(&mut watch).await.unwrap_err();
    assert!(matches!(err, StoreError::Unreachable { .. }), "{err:?}");

    // Each call fails as unreachable within its deadline (plus scheduling slack).
    let slack = timeout + Duration::from_secs(5);
    let timed = |what: &str, started: Instant, err: Option<StoreError>| {
        let err = err.unwrap_or_else(|| panic!("{what} worked with etcd down"));
        assert!(
            matches!(err, StoreError::Unreachable { .. }),
            "{what}: {err:?}"
        );
        let took = started.elapsed();
        assert!(took < slack, "{what} took {took:?} with etcd down");
        eprintln!("{what}: {err} ({took:?})");
    };
    let t = Instant::now();
    timed("list", t, store.list().await.err());
    let t = Instant::now();
    timed("get", t, store.get(DocKind::Server, "kept").await.err());
    let t = Instant::now();
    let body = server("new", "n");
    let upsert = store.upsert(DocKind::Server, "new", DocFormat::Toml, body);
    timed("upsert", t, upsert.await.err());
    let t = Instant::now();
    timed(
        "delete",
        t,
        store.delete(DocKind::Server, "kept").await.err(),
    );
    let t = Instant::now();
    timed("watch", t, store.watch(r).await.err());

    // Same data, same ports: the same store object works again once etcd is back.
    etcd.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    let listing = loop {
        match store.list().await {
            Ok(listing) => break listing,
            Err(e) if Instant::now() < deadline => {
                assert!(matches!(e, StoreError::Unreachable { .. }), "{e:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("etcd is back but the store still fails: {e:?}"),
        }
    };
    assert_eq!(listing.revision, r);
    assert_eq!(listing.docs.len(), 1);
    let mut watch = store.watch(r).await.expect("watch after restart");
    let r2 = store
        .upsert(DocKind::Server, "new", DocFormat::Toml, server("new", "n"))
        .await
        .unwrap();
    assert_eq!(put_of(next(&mut watch).await).revision, r2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_etcd_times_out_instead_of_hanging() {
    let etcd = Etcd::start();
    let timeout = Duration::from_secs(1);
    let store = store(&etcd).await.with_timeout(timeout);
    let r = store
        .upsert(
            DocKind::Server,
            "kept",
            DocFormat::Toml,
            server("kept", "k"),
        )
        .await
        .unwrap();
    let mut watch = store.watch(r).await.unwrap();

    // The port stays open but nothing answers: only the deadline ends the call.
    etcd.freeze();
    let started = Instant::now();
    let err = store.list().await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, StoreError::Unreachable { .. }), "{err:?}");
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(5),
        "list took {took:?} against a frozen etcd"
    );
    // The open watch ends once its keepalive pings go unanswered.
    let within = ETCD_KEEPALIVE_INTERVAL + ETCD_KEEPALIVE_TIMEOUT + Duration::from_secs(10);
    let ended = tokio::time::timeout(within, watch.next())
        .await
        .expect("the watch on a frozen etcd ended by keepalive");
    assert!(
        matches!(ended, Some(Err(StoreError::Unreachable { .. }))),
        "{ended:?}"
    );

    etcd.thaw();
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = store.get(DocKind::Server, "kept").await {
        assert!(
            Instant::now() < deadline,
            "etcd thawed but calls still fail: {e:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `If-Match` for the admin API: a write on the revision last read goes through in one
/// transaction; one on a stale revision conflicts, names the current one and changes
/// nothing. Every write records when it was made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conditional_write_on_a_stale_revision_conflicts() {
    let etcd = Etcd::start();
    let store = store(&etcd).await;
    let absent = store
        .upsert_if(
            DocKind::Server,
            "alpha",
            DocFormat::Toml,
            server("alpha", "a"),
            7,
        )
        .await;
    assert!(
        matches!(absent, Err(StoreError::Conflict { current: 0, .. })),
        "{absent:?}"
    );
    let r1 = store
        .upsert(
            DocKind::Server,
            "alpha",
            DocFormat::Toml,
            server("alpha", "a"),
        )
        .await
        .expect("upsert");
    let doc = store.get(DocKind::Server, "alpha").await.unwrap().unwrap();
    assert!(doc.updated_at.is_some(), "{doc:?}");
    let r2 = store
        .upsert_if(
            DocKind::Server,
            "alpha",
            DocFormat::Toml,
            server("alpha", "b"),
            r1,
        )
        .await
        .expect("a write on the current revision");
    let stale = store
        .upsert_if(
            DocKind::Server,
            "alpha",
            DocFormat::Toml,
            server("alpha", "c"),
            r1,
        )
        .await;
    assert_eq!(
        stale,
        Err(StoreError::Conflict {
            kind: DocKind::Server,
            name: "alpha".into(),
            current: r2
        })
    );
    let kept = store.get(DocKind::Server, "alpha").await.unwrap().unwrap();
    assert_eq!(kept.body, server("alpha", "b"));
}

fn put(kind: DocKind, name: &str, body: Vec<u8>) -> Write {
    Write::Put(StoredDoc {
        kind,
        name: name.into(),
        format: DocFormat::Toml,
        body,
        revision: 0,
        updated_at: None,
    })
}

/// The load errors of the registry the store holds now (what makes a node refuse it).
async fn load_errors(store: &EtcdStore) -> Vec<String> {
    let docs = store.list().await.expect("list").docs;
    Registry::from_docs(docs, "etcd", &|_: &str| None)
        .problems()
        .iter()
        .filter(|p| p.severity == Severity::Error)
        .map(ToString::to_string)
        .collect()
}

/// Two nodes each check a write against their own listing: A deletes server `s`, B adds a
/// profile naming `s`. Each is valid alone; made together they would leave a profile
/// naming an unknown server, a load error that freezes every node. The checked write
/// lets exactly one land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_checked_writes_cannot_interleave_into_a_bad_registry() {
    let etcd = Etcd::start();
    let (a, b) = (store(&etcd).await, store(&etcd).await);
    a.upsert(DocKind::Server, "s", DocFormat::Toml, server("s", "x"))
        .await
        .unwrap();
    let seen_by_a = a.list().await.unwrap();
    let seen_by_b = b.list().await.unwrap();
    let delete = Write::Delete {
        kind: DocKind::Server,
        name: "s".into(),
    };
    let add = put(
        DocKind::Profile,
        "p",
        b"name = \"p\"\nserver_ids = [\"s\"]\n".to_vec(),
    );
    check_changes(&seen_by_a.docs, "etcd", std::slice::from_ref(&delete)).unwrap();
    check_changes(&seen_by_b.docs, "etcd", std::slice::from_ref(&add)).unwrap();

    let deleted = a.apply(vec![delete], seen_by_a.revision).await.unwrap();
    assert!(deleted > seen_by_a.revision);
    let lost = b.apply(vec![add.clone()], seen_by_b.revision).await;
    assert!(matches!(lost, Err(StoreError::Changed { .. })), "{lost:?}");
    assert!(load_errors(&a).await.is_empty());
    assert!(
        a.list().await.unwrap().docs.is_empty(),
        "nothing of B's landed"
    );

    // B lists again: its check now fails, and the store stays good.
    let again = b.list().await.unwrap();
    let err = check_changes(&again.docs, "etcd", std::slice::from_ref(&add)).unwrap_err();
    assert!(err.to_string().contains("server_ids"), "{err}");

    // A plain write moves the guard too, so it also stales a listing.
    let listed = b.list().await.unwrap();
    a.upsert(DocKind::Server, "t", DocFormat::Toml, server("t", "x"))
        .await
        .unwrap();
    let stale = b
        .apply(
            vec![put(DocKind::Server, "u", server("u", "x"))],
            listed.revision,
        )
        .await;
    assert!(
        matches!(stale, Err(StoreError::Changed { .. })),
        "{stale:?}"
    );
    // A write on a fresh listing lands; the guard key is never a document.
    let fresh = b.list().await.unwrap();
    b.apply(
        vec![put(DocKind::Server, "u", server("u", "x"))],
        fresh.revision,
    )
    .await
    .unwrap();
    let mut names: Vec<_> = b
        .list()
        .await
        .unwrap()
        .docs
        .into_iter()
        .map(|d| d.name)
        .collect();
    names.sort();
    assert_eq!(names, ["t", "u"]);
}

/// One checked write is one etcd transaction: more documents than etcd's default
/// `--max-txn-ops` allows (with the guard) are refused before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checked_write_is_one_transaction_within_etcds_op_limit() {
    let etcd = Etcd::start();
    let store = store(&etcd).await;
    let listed = store.list().await.unwrap();
    let max = quiver_node::defaults::ETCD_MAX_TXN_WRITES;
    let writes = |n: usize| -> Vec<Write> {
        (0..n)
            .map(|i| {
                let id = format!("s{i}");
                put(DocKind::Server, &id, server(&id, "x"))
            })
            .collect()
    };
    let err = store
        .apply(writes(max + 1), listed.revision)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Invalid(m) if m.contains("split")),
        "{err:?}"
    );
    assert!(store.list().await.unwrap().docs.is_empty());
    // The largest allowed set is accepted by a real etcd, all at one revision.
    let revision = store.apply(writes(max), listed.revision).await.unwrap();
    let docs = store.list().await.unwrap().docs;
    assert_eq!(docs.len(), max);
    assert!(docs.iter().all(|d| d.revision == revision));
}

/// A newer node may add envelope fields; an older node still reads the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envelope_with_a_field_this_node_does_not_know_is_still_read() {
    let etcd = Etcd::start();
    let store = store(&etcd).await;
    let mut raw = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .unwrap();
    let body = String::from_utf8(server("newer", "x")).unwrap();
    let value = serde_json::json!({"format": "toml", "body": body, "schema": 2, "updated_at": 5});
    raw.put("/quiver/servers/newer", value.to_string(), None)
        .await
        .unwrap();
    let doc = store
        .get(DocKind::Server, "newer")
        .await
        .unwrap()
        .expect("read");
    assert_eq!((doc.body, doc.updated_at), (server("newer", "x"), Some(5)));
    // Without a body it is still no document.
    raw.put("/quiver/servers/bodiless", r#"{"format":"toml"}"#, None)
        .await
        .unwrap();
    assert!(
        store
            .get(DocKind::Server, "bodiless")
            .await
            .unwrap()
            .is_none()
    );
}
