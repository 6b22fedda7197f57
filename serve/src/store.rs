//! A quota's state on disk: the coordinator's snapshot, the members' lease records, the
//! agent names and the epoch, in one owner-only file written whole (a new file renamed
//! over the old, so a crash leaves one or the other), coalesced: every change made before a
//! write starts shares it. A reply that must not be lost (every mutating API call) waits
//! for the write that carries its change; background changes (a grant from the line, an
//! expiry, a proxied call settling) wait up to [`BACKGROUND`] for others.
//!
//! In a cluster (`serve --cluster`) the state is saved in the shared store instead, under
//! the quota's owner term ([`crate::cluster::Seat::save`]): a save the store refuses (the
//! term is over) fails the replies that wait for it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// How long a change no reply waits for may gather with others before one write.
pub(crate) const BACKGROUND: Duration = Duration::from_millis(50);

/// What a quota's file holds.
#[derive(Debug)]
pub(crate) struct Saved {
    /// The coordinator's snapshot (its JSON text).
    pub(crate) snapshot: String,
    /// The epoch of the state (part of every lease handle).
    pub(crate) epoch: String,
    /// The members' lease records, `[id, record]`.
    pub(crate) leases: Vec<(u64, Value)>,
    /// The agent names remembered, `[id, name]`.
    pub(crate) names: Vec<(u64, String)>,
}

impl Saved {
    /// The state as the shared store keeps it (the file's format).
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        self.to_json().to_string().into_bytes()
    }

    /// The state from the shared store's bytes; `None` if they are not this format.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Option<Saved> {
        Saved::from_json(&serde_json::from_slice(bytes).ok()?)
    }

    fn to_json(&self) -> Value {
        json!({
            "version": 1,
            "epoch": self.epoch,
            "snapshot": self.snapshot,
            "leases": self.leases.iter().map(|(id, r)| json!([id, r])).collect::<Vec<_>>(),
            "names": self.names.iter().map(|(id, n)| json!([id, n])).collect::<Vec<_>>(),
        })
    }

    fn from_json(v: &Value) -> Option<Saved> {
        let pairs = |key: &str| {
            v.get(key)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        Some(Saved {
            snapshot: v.get("snapshot")?.as_str()?.to_owned(),
            epoch: v.get("epoch")?.as_str()?.to_owned(),
            leases: pairs("leases")
                .iter()
                .filter_map(|p| Some((p.get(0)?.as_u64()?, p.get(1)?.clone())))
                .collect(),
            names: pairs("names")
                .iter()
                .filter_map(|p| Some((p.get(0)?.as_u64()?, p.get(1)?.as_str()?.to_owned())))
                .collect(),
        })
    }
}

/// Where a quota's state goes.
#[derive(Debug)]
enum Backend {
    /// A file of this machine.
    File(PathBuf),
    /// The cluster's shared store, under the quota's owner term.
    Cluster(Arc<crate::cluster::Seat>),
}

/// One quota's file (or place in the cluster's store) and its writes.
#[derive(Debug)]
pub(crate) struct Store {
    backend: Backend,
    due: Mutex<Due>,
    notify: Notify,
    written: watch::Sender<u64>,
    /// Whether the last write landed.
    ok: AtomicBool,
}

#[derive(Debug, Default)]
struct Due {
    /// The change counter: the next write carries every change up to it.
    wanted: u64,
    /// When the next write starts (`None`: nothing to write).
    at: Option<Instant>,
}

impl Store {
    /// The store of the file at `path`.
    pub(crate) fn new(path: PathBuf) -> Store {
        Store::on(Backend::File(path))
    }

    /// The store of a quota of a cluster, saved under `seat`'s owner term.
    pub(crate) fn cluster(seat: Arc<crate::cluster::Seat>) -> Store {
        Store::on(Backend::Cluster(seat))
    }

    fn on(backend: Backend) -> Store {
        Store {
            backend,
            due: Mutex::new(Due::default()),
            notify: Notify::new(),
            written: watch::channel(0).0,
            ok: AtomicBool::new(true),
        }
    }

    /// What the file holds; `Ok(None)` when there is no file yet (or in a cluster, where
    /// the state comes from the shared store when this instance becomes the owner).
    pub(crate) fn read(&self) -> Result<Option<Saved>, String> {
        let Backend::File(path) = &self.backend else {
            return Ok(None);
        };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            format!(
                "{} is not the state this program writes: {e}",
                path.display()
            )
        })?;
        Saved::from_json(&v)
            .map(Some)
            .ok_or_else(|| format!("{} is not the state this program writes", path.display()))
    }

    /// A change to write within `delay`: answers the change's number ([`Store::written`]).
    pub(crate) fn changed(&self, delay: Duration) -> u64 {
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        due.wanted += 1;
        let at = Instant::now() + delay;
        if due.at.is_none_or(|t| at < t) {
            due.at = Some(at);
            self.notify.notify_one();
        }
        due.wanted
    }

    /// Until change `n` is written; whether it landed (in a cluster: not if the owner term
    /// ended first).
    pub(crate) async fn written(&self, n: u64) -> bool {
        let mut rx = self.written.subscribe();
        let _ = rx.wait_for(|w| *w >= n).await;
        self.ok.load(Ordering::SeqCst)
    }

    /// The writer: writes what `state` answers each time a change falls due, one write at
    /// a time. Runs until the process ends.
    pub(crate) async fn run(&self, state: impl Fn() -> Option<Saved>) {
        loop {
            let at = loop {
                let notified = self.notify.notified();
                if let Some(at) = self.due.lock().unwrap_or_else(PoisonError::into_inner).at {
                    break at;
                }
                notified.await;
            };
            tokio::time::sleep_until(at).await;
            let n = {
                let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
                if due.at.is_some_and(|t| t > Instant::now()) {
                    continue;
                }
                due.at = None;
                due.wanted
            };
            let ok = match &self.backend {
                Backend::Cluster(seat) => seat.save(|| state().map(|s| s.to_bytes())).await,
                Backend::File(path) => match state() {
                    None => true,
                    Some(saved) => {
                        let (to, text) = (path.clone(), saved.to_json().to_string());
                        let wrote = tokio::task::spawn_blocking(move || {
                            write_private(&to, text.as_bytes())
                        })
                        .await;
                        if let Ok(Err(e)) | Err(e) =
                            wrote.map_err(|e| std::io::Error::other(e.to_string()))
                        {
                            eprintln!("tokenwarden: cannot write {}: {e}", path.display());
                        }
                        true
                    }
                },
            };
            self.ok.store(ok, Ordering::SeqCst);
            self.written.send_replace(n);
        }
    }

    /// Writes `saved` now (at shutdown).
    pub(crate) async fn write_now(&self, saved: &Saved) -> Result<(), String> {
        match &self.backend {
            Backend::File(path) => write_private(path, saved.to_json().to_string().as_bytes())
                .map_err(|e| format!("cannot write {}: {e}", path.display())),
            Backend::Cluster(seat) => {
                if seat.save(|| Some(saved.to_bytes())).await {
                    Ok(())
                } else {
                    Err("not saved in the cluster's store (this instance does not own the quota now)".into())
                }
            }
        }
    }

    /// The quota's place in the cluster, if its state is saved there.
    pub(crate) fn seat(&self) -> Option<Arc<crate::cluster::Seat>> {
        match &self.backend {
            Backend::Cluster(seat) => Some(Arc::clone(seat)),
            Backend::File(_) => None,
        }
    }

    /// Deletes the file (a reset). In a cluster the next change saves the new state.
    pub(crate) fn remove(&self) {
        if let Backend::File(path) = &self.backend {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Writes `bytes` to `path` as an owner-only file (0600), through a new file beside it
/// renamed over it.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let done = (|| {
        let mut f = opts.open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_data()?;
        std::fs::rename(&tmp, path)
    })();
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}
