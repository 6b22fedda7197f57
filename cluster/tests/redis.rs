//! The Redis elector against a real `redis-server` (Debian's; `scripts/test.sh` installs
//! it), started here on a free loopback port and stopped after. Set
//! `TOKENWARDEN_REDIS_SERVER` to use another binary (`valkey-server`). The tests run one at
//! a time (`ONE_AT_A_TIME`): one of them stops its server and starts it again on the same
//! port, which another test's server must not take meanwhile.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokenwarden_cluster::{Elector, QuotaKey, RedisElector, Saved, term_end};
use tokio::time::{Instant, sleep};

/// Held by each test for its whole run.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Server::on(port, extra)
    }

    fn on(port: u16, extra: &[&str]) -> Server {
        let bin =
            std::env::var("TOKENWARDEN_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let port_s = port.to_string();
        let mut args = vec![
            "--port",
            &port_s,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ];
        args.extend_from_slice(extra);
        let child = Command::new(&bin)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{bin} does not start ({e}): install it (apt-get install redis-server; scripts/test.sh does) or set TOKENWARDEN_REDIS_SERVER"));
        let mut s = Server { child, port };
        for _ in 0..200 {
            // Listening, and ours (not another process's on the same port: ours would exit).
            if let Ok(Some(status)) = s.child.try_wait() {
                panic!("{bin} exited ({status}) instead of listening on 127.0.0.1:{port}");
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                std::thread::sleep(Duration::from_millis(20));
                if let Ok(Some(status)) = s.child.try_wait() {
                    panic!("{bin} exited ({status}): 127.0.0.1:{port} is another process's");
                }
                return s;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("{bin} did not listen on 127.0.0.1:{port} within 2 s");
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn elector(&self) -> RedisElector {
        RedisElector::new(&self.url(), Duration::from_millis(500)).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const TTL: Duration = Duration::from_millis(400);

#[tokio::test]
async fn one_owner_at_a_time_and_its_token_grows_with_each_new_owner() {
    let _one = ONE_AT_A_TIME.lock().await;
    let s = Server::start(&[]);
    let q = QuotaKey::new("fleet", "quota");
    let e: Vec<RedisElector> = (0..3).map(|_| s.elector()).collect();
    let ids = ["a#1", "b#2", "c#3"];
    // All three at once: the server runs one script at a time, so one takes the lease.
    let (t0, t1, t2) = tokio::join!(
        e[0].campaign(&q, ids[0], TTL),
        e[1].campaign(&q, ids[1], TTL),
        e[2].campaign(&q, ids[2], TTL)
    );
    let terms = [t0.unwrap(), t1.unwrap(), t2.unwrap()];
    let owners: Vec<_> = terms.iter().filter(|t| t.mine).collect();
    assert_eq!(owners.len(), 1, "{terms:?}");
    let first = owners[0].clone();
    for t in &terms {
        assert_eq!(
            (t.token, t.owner.as_str()),
            (first.token, first.owner.as_str())
        );
    }
    // The owner renews: the same term, a later end; the others still see it.
    let i = ids.iter().position(|id| *id == first.owner).unwrap();
    let sent = Instant::now();
    let renewed = e[i].campaign(&q, ids[i], TTL).await.unwrap();
    assert!(renewed.mine && renewed.token == first.token);
    assert!(
        renewed.valid_until <= term_end(Instant::now(), TTL)
            && renewed.valid_until >= term_end(sent, TTL)
    );
    let other = (i + 1) % 3;
    let seen = e[other].campaign(&q, ids[other], TTL).await.unwrap();
    assert!(!seen.mine && seen.owner == first.owner && seen.valid_until > Instant::now());
    // It stops renewing: once its lease lapses, another takes over with a larger token.
    sleep(TTL + Duration::from_millis(50)).await;
    assert!(
        !renewed.owns(Instant::now()),
        "the old owner stopped believing before the store let go"
    );
    let next = e[other].campaign(&q, ids[other], TTL).await.unwrap();
    assert!(next.mine, "{next:?}");
    assert_eq!(next.token, first.token + 1);
    // A quota of its own elects apart.
    let q2 = QuotaKey::new("fleet", "other");
    assert!(e[i].campaign(&q2, ids[i], TTL).await.unwrap().mine);
}

#[tokio::test]
async fn a_stale_owner_cannot_save_over_its_successor() {
    let _one = ONE_AT_A_TIME.lock().await;
    let s = Server::start(&[]);
    let q = QuotaKey::new("f", "q");
    let (a, b) = (s.elector(), s.elector());
    assert_eq!(a.load(&q).await.unwrap(), None);
    let old = a.campaign(&q, "a", TTL).await.unwrap();
    assert_eq!(a.save(&q, &old, b"state 1").await.unwrap(), Saved::Written);
    let stored = b.load(&q).await.unwrap().unwrap();
    assert_eq!(
        (stored.token, stored.state.as_slice()),
        (old.token, &b"state 1"[..])
    );
    // `a` is paused past its lease; `b` takes over, loads and saves.
    sleep(TTL + Duration::from_millis(50)).await;
    let new = b.campaign(&q, "b", TTL).await.unwrap();
    assert!(new.mine && new.token > old.token);
    // `a` wakes and saves: refused, before and after `b` saves.
    assert_eq!(a.save(&q, &old, b"stale").await.unwrap(), Saved::Fenced);
    assert_eq!(b.save(&q, &new, b"state 2").await.unwrap(), Saved::Written);
    assert_eq!(a.save(&q, &old, b"stale").await.unwrap(), Saved::Fenced);
    let stored = a.load(&q).await.unwrap().unwrap();
    assert_eq!(
        (stored.token, stored.state.as_slice()),
        (new.token, &b"state 2"[..])
    );
    // A term that lapsed with no successor saves nothing either (its owner must campaign again).
    sleep(TTL + Duration::from_millis(50)).await;
    assert_eq!(b.save(&q, &new, b"late").await.unwrap(), Saved::Fenced);
    // A lapsed owner that campaigns again gets a new term, a new token.
    let again = b.campaign(&q, "b", TTL).await.unwrap();
    assert!(again.mine && again.token == new.token + 1);
    // The token counter lost on its own (evicted, deleted): the next term is still above
    // the saved state's, so its saves are not fenced by it.
    b.save(&q, &again, b"state 3").await.unwrap();
    let token_key = q.of("token");
    let deleted = std::process::Command::new("redis-cli")
        .args(["-p", &s.port.to_string(), "DEL", &token_key])
        .output()
        .expect("redis-cli");
    assert_eq!(String::from_utf8_lossy(&deleted.stdout).trim(), "1");
    // Resigning hands over at once.
    a.resign(&q, &again).await.unwrap(); // not a's to resign: the term is b's, held as b
    b.resign(&q, &again).await.unwrap();
    let taken = a.campaign(&q, "a", TTL).await.unwrap();
    assert!(taken.mine && taken.token == again.token + 1, "{taken:?}");
}

#[tokio::test]
async fn heartbeats_count_the_instances_alive_by_the_servers_clock() {
    let _one = ONE_AT_A_TIME.lock().await;
    let s = Server::start(&[]);
    let q = QuotaKey::new("f", "q");
    let e = s.elector();
    assert_eq!(e.heartbeat(&q, "a", TTL).await.unwrap(), 1);
    assert_eq!(e.heartbeat(&q, "b", TTL).await.unwrap(), 2);
    assert_eq!(e.heartbeat(&q, "c", TTL).await.unwrap(), 3);
    e.leave(&q, "c").await.unwrap();
    assert_eq!(e.heartbeat(&q, "a", TTL).await.unwrap(), 2);
    sleep(TTL + Duration::from_millis(50)).await;
    // `b` stopped beating: only `a` is counted.
    assert_eq!(e.heartbeat(&q, "a", TTL).await.unwrap(), 1);
}

#[tokio::test]
async fn a_lost_server_is_an_error_in_time_and_a_returned_one_is_used_again() {
    let _one = ONE_AT_A_TIME.lock().await;
    let s = Server::start(&[]);
    let port = s.port;
    let q = QuotaKey::new("f", "q");
    let e = s.elector();
    assert!(e.campaign(&q, "a", TTL).await.unwrap().mine);
    drop(s);
    let t = Instant::now();
    let err = e.campaign(&q, "a", TTL).await.unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(err.0.contains("unreachable"), "{err}");
    // The server comes back (empty: no persistence here): the same elector dials again.
    let _back = Server::on(port, &[]);
    let term = e.campaign(&q, "a", TTL).await.unwrap();
    assert!(term.mine && term.token == 1, "{term:?}");
}

#[tokio::test]
async fn a_password_is_sent_and_a_missing_one_named() {
    let _one = ONE_AT_A_TIME.lock().await;
    let s = Server::start(&["--requirepass", "s3cret"]);
    let q = QuotaKey::new("f", "q");
    let without = s.elector();
    let err = without.campaign(&q, "a", TTL).await.unwrap_err();
    assert!(err.0.contains("NOAUTH"), "{err}");
    let with = RedisElector::new(
        &format!("redis://:s3cret@127.0.0.1:{}/3", s.port),
        Duration::from_millis(500),
    )
    .unwrap();
    assert!(with.campaign(&q, "a", TTL).await.unwrap().mine);
    let e =
        RedisElector::new("redis://127.0.0.1:notaport", Duration::from_millis(500)).unwrap_err();
    assert!(e.contains("port"), "{e}");
}
