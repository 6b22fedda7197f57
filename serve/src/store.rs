//! A quota's state on disk: the coordinator's snapshot, the members' lease records, the
//! agent names and the epoch, in one owner-only file written whole (a new file renamed
//! over the old, so a crash leaves one or the other), coalesced: every change made before a
//! write starts shares it. A reply that must not be lost (every mutating API call) waits
//! for the write that carries its change; background changes (a grant from the line, an
//! expiry, a proxied call settling) wait up to [`BACKGROUND`] for others.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
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

/// One quota's file and its writes.
#[derive(Debug)]
pub(crate) struct Store {
    path: PathBuf,
    due: Mutex<Due>,
    notify: Notify,
    written: watch::Sender<u64>,
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
        Store {
            path,
            due: Mutex::new(Due::default()),
            notify: Notify::new(),
            written: watch::channel(0).0,
        }
    }

    /// What the file holds; `Ok(None)` when there is no file yet.
    pub(crate) fn read(&self) -> Result<Option<Saved>, String> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read {}: {e}", self.path.display())),
        };
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            format!(
                "{} is not the state this program writes: {e}",
                self.path.display()
            )
        })?;
        Saved::from_json(&v).map(Some).ok_or_else(|| {
            format!(
                "{} is not the state this program writes",
                self.path.display()
            )
        })
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

    /// Until change `n` is on disk.
    pub(crate) async fn written(&self, n: u64) {
        let mut rx = self.written.subscribe();
        let _ = rx.wait_for(|w| *w >= n).await;
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
            if let Some(saved) = state() {
                let path = self.path.clone();
                let text = saved.to_json().to_string();
                let wrote =
                    tokio::task::spawn_blocking(move || write_private(&path, text.as_bytes()))
                        .await;
                if let Ok(Err(e)) | Err(e) = wrote.map_err(|e| std::io::Error::other(e.to_string()))
                {
                    eprintln!("tokenwarden: cannot write {}: {e}", self.path.display());
                }
            }
            self.written.send_replace(n);
        }
    }

    /// Writes `saved` now (at shutdown).
    pub(crate) fn write_now(&self, saved: &Saved) -> std::io::Result<()> {
        write_private(&self.path, saved.to_json().to_string().as_bytes())
    }

    /// Deletes the file (a reset).
    pub(crate) fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
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
