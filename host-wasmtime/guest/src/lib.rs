//! `tokenwarden-core` exported through the `tokenwarden:quota/coordinator` interface
//! (`../wit/v4`): the core's host protocol, its `Input`, `Output` and `Event` as the JSON
//! the core defines. Every function decodes, calls the core once and encodes: there is no
//! logic here, so the component decides exactly as the native crate does.
//!
//! Built for `wasm32-unknown-unknown` by `../build.rs` and wrapped into a component with
//! `wit-component`; the module imports nothing (no WASI), which the host's tests assert.

use std::cell::RefCell;

use tokenwarden_core as tw;

wit_bindgen::generate!({
    path: "../wit/v4",
    world: "plugin",
});

use exports::tokenwarden::quota::coordinator as w;

struct Component;

/// The resource's representation: a `Coordinator` behind a `RefCell` (resource methods
/// take `&self`; a component instance is single-threaded).
struct Coord(RefCell<tw::Coordinator>);

impl w::Guest for Component {
    type Coordinator = Coord;
}

fn lease_error(e: tw::LeaseError) -> w::LeaseError {
    match e {
        tw::LeaseError::UnknownPool => w::LeaseError::UnknownPool,
        tw::LeaseError::UnknownLease => w::LeaseError::UnknownLease,
        tw::LeaseError::NotGranted => w::LeaseError::NotGranted,
        tw::LeaseError::TooLarge { field } => w::LeaseError::TooLarge(field.into()),
        tw::LeaseError::UnknownTask => w::LeaseError::UnknownTask,
        tw::LeaseError::TooManyTasks => w::LeaseError::TooManyTasks,
        tw::LeaseError::Forbidden => w::LeaseError::Forbidden,
        // The core may grow variants; the host maps an unknown code to an error too.
        _ => w::LeaseError::TooLarge(String::from("unknown")),
    }
}

fn restore_error(e: tw::RestoreError) -> w::RestoreError {
    match e {
        tw::RestoreError::UnsupportedVersion(v) => w::RestoreError::UnsupportedVersion(v),
        tw::RestoreError::Parse(e) => w::RestoreError::Parse(e.to_string()),
        tw::RestoreError::Config(e) => w::RestoreError::Config(e.to_string()),
        tw::RestoreError::Corrupt(what) => w::RestoreError::Corrupt(what.into()),
        other => w::RestoreError::Corrupt(other.to_string()),
    }
}

impl Coord {
    fn wrap(c: tw::Coordinator) -> w::Coordinator {
        w::Coordinator::new(Coord(RefCell::new(c)))
    }
}

impl w::GuestCoordinator for Coord {
    fn create(config_json: String, seed: u64, now: u64) -> Result<w::Coordinator, w::ConfigError> {
        let config_error = |e: tw::ConfigError| match e {
            tw::ConfigError::Invalid { field, reason } => {
                w::ConfigError::Invalid(w::InvalidField {
                    field: field.to_string(),
                    reason: reason.into(),
                })
            }
            other => w::ConfigError::Parse(other.to_string()),
        };
        let config = tw::Config::from_json(&config_json).map_err(config_error)?;
        tw::Coordinator::new(config, seed, tw::Millis(now))
            .map(Coord::wrap)
            .map_err(config_error)
    }

    fn restore(snapshot_json: String) -> Result<w::Coordinator, w::RestoreError> {
        tw::Coordinator::restore_json(&snapshot_json)
            .map(Coord::wrap)
            .map_err(restore_error)
    }

    fn handle(&self, now: u64, input: String) -> Result<String, w::ProtocolError> {
        let input: tw::Input = serde_json::from_str(&input)
            .map_err(|e| w::ProtocolError::InvalidInput(e.to_string()))?;
        let output = self
            .0
            .borrow_mut()
            .handle(tw::Millis(now), &input)
            .map_err(|e| w::ProtocolError::Lease(lease_error(e)))?;
        serde_json::to_string(&output).map_err(|e| w::ProtocolError::InvalidInput(e.to_string()))
    }

    fn poll_timeout(&self) -> Option<u64> {
        self.0.borrow().poll_timeout().map(|t| t.0)
    }

    fn poll_event(&self) -> Option<String> {
        let event = self.0.borrow_mut().poll_event()?;
        // An event always serializes (plain data); an empty answer would be the host's
        // `incompatible` error, never a lost event in silence.
        Some(serde_json::to_string(&event).unwrap_or_default())
    }

    fn metrics(&self, now: u64) -> String {
        let m = self.0.borrow().metrics(tw::Millis(now));
        serde_json::to_string(&m).unwrap_or_default()
    }

    fn snapshot(&self) -> String {
        self.0.borrow().snapshot_json()
    }

    fn now(&self) -> u64 {
        self.0.borrow().now().0
    }

    fn pool_by_name(&self, name: String) -> Option<u32> {
        self.0.borrow().pool_id(&name).map(|p| p.0)
    }

    fn check(&self) -> Result<(), String> {
        self.0.borrow().check().map_err(String::from)
    }
}

export!(Component);
