//! # tokenwarden-wasmtime
//!
//! [`tokenwarden-core`](tokenwarden_core) compiled to a WebAssembly component (WIT world
//! `tokenwarden:quota/plugin@4.0.0`, in `wit/v4/`) and a host that runs it under wasmtime
//! as a sandboxed plugin.
//!
//! The plugin speaks the core's host protocol: [`PluginCoordinator::handle`] takes an
//! [`Input`] and answers an [`Output`], [`PluginCoordinator::poll_event`] gives [`Event`]s
//! and [`PluginCoordinator::poll_timeout`] when to send [`Input::Timeout`], exactly as
//! [`Coordinator::handle`](tokenwarden_core::Coordinator::handle) and its polls do, so a
//! host written against the protocol runs on either. They cross the component boundary as
//! the JSON the core defines (the one encoding every host uses), so an input the core
//! gains needs no change to the interface or this host. The differences from the native
//! coordinator:
//!
//! * every call returns `Result<_, Error>`: [`Error::Lease`] carries the core's
//!   [`LeaseError`] (same codes), and [`Error::Plugin`] reports what only a plugin can do
//!   wrong (trap, fuel exhausted, memory limit, incompatible component);
//! * the core's typed methods (`request_lease`, `settle`, …) are inputs to `handle`.
//!
//! Each coordinator lives in its own [`Store`] with a fuel budget per call and a cap on
//! linear memory, so a misbehaving plugin ends in an error value: it cannot hang or crash
//! the host. The [`Engine`] and the pre-instantiated component ([`InstancePre`]) are shared
//! by every coordinator of a [`Plugin`]; instantiating another one takes microseconds.
//!
//! [`PluginCoordinator::reload`] swaps in another component at runtime and carries the
//! whole state (leases, queued tickets, debt, pauses, PRNG) across with snapshot/restore.
//!
//! ```
//! use tokenwarden_core::{AgentId, Input, LeaseRequest, Millis, Output, PoolId, Usage};
//! use tokenwarden_wasmtime::{COMPONENT, Plugin};
//!
//! let plugin = Plugin::new(&Plugin::default_engine()?, COMPONENT)?;
//! let mut coord = plugin.coordinator(
//!     r#"{ "pools": [{ "name": "sonnet", "input_tokens_per_minute": 40000 }] }"#,
//!     42,
//!     Millis(0),
//! )?;
//! let request = LeaseRequest { agent: AgentId(1), pool: PoolId(0), input_tokens: 1_000, ..Default::default() };
//! let Output::Granted { lease, .. } = coord.handle(Millis(0), &Input::RequestLease { request })? else {
//!     panic!("it fits")
//! };
//! let usage = Usage { input_tokens: 900, output_tokens: 120, ..Default::default() };
//! assert!(matches!(coord.handle(Millis(800), &Input::Settle { lease, usage })?, Output::Settled { .. }));
//! # Ok::<(), tokenwarden_wasmtime::Error>(())
//! ```

use core::fmt;

use tokenwarden_core::{Event, Input, LeaseError, Metrics, Millis, Output, PoolId, Snapshot};
pub use wasmtime;
use wasmtime::component::{Component, InstancePre, Linker, ResourceAny};
use wasmtime::{Engine, Store};

#[allow(missing_docs, unreachable_pub, clippy::all)]
mod bindings {
    wasmtime::component::bindgen!({
        path: "wit/v4",
        world: "plugin",
    });
}

use bindings::exports::tokenwarden::quota::coordinator as w;

/// The tokenwarden component built from this workspace's `tokenwarden-core` (by
/// `build.rs`): the default plugin.
pub const COMPONENT: &[u8] = include_bytes!(env!("TOKENWARDEN_COMPONENT"));

/// The WIT package this host speaks.
pub const WIT_PACKAGE: &str = "tokenwarden:quota@4.0.0";

/// The exported interface the host looks up in a component.
pub const WIT_INTERFACE: &str = "tokenwarden:quota/coordinator@4.0.0";

/// Resource limits applied to every coordinator of a [`Plugin`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Fuel (roughly, wasm instructions) one call may burn before it is stopped with
    /// [`PluginError::FuelExhausted`]. `None`: unlimited. Needs an engine with
    /// `consume_fuel` on (see [`Plugin::default_engine`]); ignored otherwise.
    pub fuel_per_call: Option<u64>,
    /// Largest linear memory, in bytes; a growth beyond it fails inside the plugin, which
    /// then traps and is reported as [`PluginError::MemoryLimit`].
    pub memory_bytes: usize,
}

impl Default for Limits {
    /// 100 million units of fuel per call (the heaviest conformance call uses well under
    /// a million) and 64 MiB of memory.
    fn default() -> Self {
        Limits {
            fuel_per_call: Some(100_000_000),
            memory_bytes: 64 << 20,
        }
    }
}

/// What went wrong in the plugin itself (never a decision of the coordinator).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PluginError {
    /// The plugin trapped (a bug in the component, a stack overflow, ...).
    Trap(String),
    /// A call used up its fuel budget ([`Limits::fuel_per_call`]).
    FuelExhausted,
    /// The plugin tried to grow its memory beyond [`Limits::memory_bytes`].
    MemoryLimit {
        /// The cap in force.
        limit_bytes: usize,
    },
    /// The bytes are not a component of the `tokenwarden:quota@3.0.0` `plugin` world (or it
    /// imports something, or it answered with something the host cannot read).
    Incompatible(String),
    /// An earlier call on this coordinator failed inside the plugin, which leaves the
    /// instance unusable: restore a snapshot into a fresh coordinator.
    Poisoned,
}

impl PluginError {
    /// A stable, machine-readable code.
    #[must_use]
    pub const fn code(&self) -> &'static str {
        match self {
            PluginError::Trap(_) => "plugin_trap",
            PluginError::FuelExhausted => "plugin_fuel_exhausted",
            PluginError::MemoryLimit { .. } => "plugin_memory_limit",
            PluginError::Incompatible(_) => "plugin_incompatible",
            PluginError::Poisoned => "plugin_poisoned",
        }
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PluginError::Trap(m) => write!(f, "plugin trapped: {m}"),
            PluginError::FuelExhausted => f.write_str("plugin call ran out of fuel"),
            PluginError::MemoryLimit { limit_bytes } => {
                write!(f, "plugin exceeded its memory limit of {limit_bytes} bytes")
            }
            PluginError::Incompatible(m) => write!(f, "incompatible plugin: {m}"),
            PluginError::Poisoned => {
                f.write_str("plugin instance is unusable after an earlier failure")
            }
        }
    }
}

/// Any failure of a plugin call.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The core refused the call; exactly what the native coordinator returns.
    Lease(LeaseError),
    /// The configuration could not be used (`config_parse` or `invalid_config`).
    Config {
        /// The core's `ConfigError::code()`.
        code: &'static str,
        /// The offending field (`pools[1].input_tokens_per_minute`), for `invalid_config`.
        field: Option<String>,
        /// The core's message.
        message: String,
    },
    /// A snapshot could not be restored (the core's `RestoreError::code()`).
    Restore {
        /// `snapshot_version`, `snapshot_parse`, `snapshot_config` or `snapshot_corrupt`.
        code: &'static str,
        /// The core's message.
        message: String,
    },
    /// The plugin failed.
    Plugin(PluginError),
}

impl Error {
    /// A stable, machine-readable code: the core's codes for core errors, `plugin_*` for
    /// plugin failures.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Error::Lease(e) => e.code(),
            Error::Config { code, .. } | Error::Restore { code, .. } => code,
            Error::Plugin(p) => p.code(),
        }
    }

    /// The core's error, if the core refused the call.
    #[must_use]
    pub fn lease_error(&self) -> Option<LeaseError> {
        match self {
            Error::Lease(e) => Some(*e),
            _ => None,
        }
    }

    /// The plugin failure, if the plugin failed.
    #[must_use]
    pub fn plugin_error(&self) -> Option<&PluginError> {
        match self {
            Error::Plugin(p) => Some(p),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Lease(e) => e.fmt(f),
            Error::Config { message, .. } | Error::Restore { message, .. } => f.write_str(message),
            Error::Plugin(p) => p.fmt(f),
        }
    }
}

impl std::error::Error for Error {}

impl From<LeaseError> for Error {
    fn from(e: LeaseError) -> Self {
        Error::Lease(e)
    }
}

impl From<PluginError> for Error {
    fn from(e: PluginError) -> Self {
        Error::Plugin(e)
    }
}

fn incompatible(e: impl fmt::Display) -> Error {
    Error::Plugin(PluginError::Incompatible(e.to_string()))
}

/// Per-store host state: only the memory limiter (the world imports nothing).
struct HostState {
    limiter: MemoryCap,
}

struct MemoryCap {
    max_bytes: usize,
    hit: bool,
}

impl wasmtime::ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_bytes {
            self.hit = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 16)
    }

    fn instances(&self) -> usize {
        16
    }

    fn tables(&self) -> usize {
        16
    }

    fn memories(&self) -> usize {
        4
    }
}

/// A loaded component: the engine and the pre-instantiated component, shared by every
/// coordinator created from it. Cheap to clone.
#[derive(Clone)]
pub struct Plugin {
    pre: bindings::PluginPre<HostState>,
    limits: Limits,
    fuel: bool,
}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plugin")
            .field("limits", &self.limits)
            .field("fuel", &self.fuel)
            .finish_non_exhaustive()
    }
}

impl Plugin {
    /// An engine set up for plugins: Cranelift, fuel metering on.
    pub fn default_engine() -> Result<Engine, Error> {
        let mut config = wasmtime::Config::new();
        config.consume_fuel(true);
        Engine::new(&config).map_err(|e| Error::Plugin(PluginError::Incompatible(e.to_string())))
    }

    /// Compiles `component` (binary or, with wasmtime's `wat` feature, text) for `engine`
    /// and pre-instantiates it. Fails with [`PluginError::Incompatible`] unless it is a
    /// component of the `plugin` world that imports nothing.
    pub fn new(engine: &Engine, component: &[u8]) -> Result<Plugin, Error> {
        let component = Component::new(engine, component).map_err(incompatible)?;
        Plugin::from_component(engine, &component)
    }

    /// [`Plugin::new`] from an already compiled component.
    pub fn from_component(engine: &Engine, component: &Component) -> Result<Plugin, Error> {
        if let Some((name, _)) = component.component_type().imports(engine).next() {
            return Err(incompatible(format!(
                "the component imports `{name}`; a tokenwarden plugin imports nothing"
            )));
        }
        let linker: Linker<HostState> = Linker::new(engine);
        let pre: InstancePre<HostState> =
            linker.instantiate_pre(component).map_err(incompatible)?;
        let pre = bindings::PluginPre::new(pre).map_err(incompatible)?;
        // Fuel works only if the engine meters it.
        let fuel = Store::new(engine, ()).set_fuel(0).is_ok();
        Ok(Plugin {
            pre,
            limits: Limits::default(),
            fuel,
        })
    }

    /// The same plugin with other limits for the coordinators created from now on.
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Plugin {
        self.limits = limits;
        self
    }

    /// The limits in force.
    #[must_use]
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The engine.
    #[must_use]
    pub fn engine(&self) -> &Engine {
        self.pre.engine()
    }

    /// The compiled component.
    #[must_use]
    pub fn component(&self) -> &Component {
        self.pre.instance_pre().component()
    }

    /// `Coordinator::new(Config::from_json(config_json)?, seed, now)` inside a fresh
    /// instance of the component.
    pub fn coordinator(
        &self,
        config_json: &str,
        seed: u64,
        now: Millis,
    ) -> Result<PluginCoordinator, Error> {
        let mut inst = self.instantiate()?;
        let made = inst
            .call(|bindings, store| {
                bindings
                    .tokenwarden_quota_coordinator()
                    .coordinator()
                    .call_create(store, config_json, seed, now.0)
            })?
            .map_err(|e| match e {
                w::ConfigError::Parse(message) => Error::Config {
                    code: "config_parse",
                    field: None,
                    message,
                },
                w::ConfigError::Invalid(w::InvalidField { field, reason }) => Error::Config {
                    code: "invalid_config",
                    message: format!("invalid config: {field} {reason}"),
                    field: Some(field),
                },
            })?;
        Ok(inst.with(made))
    }

    /// `Coordinator::restore_json(snapshot_json)` inside a fresh instance.
    pub fn restore_json(&self, snapshot_json: &str) -> Result<PluginCoordinator, Error> {
        let mut inst = self.instantiate()?;
        let made = inst
            .call(|bindings, store| {
                bindings
                    .tokenwarden_quota_coordinator()
                    .coordinator()
                    .call_restore(store, snapshot_json)
            })?
            .map_err(|e| {
                let (code, message) = match e {
                    w::RestoreError::UnsupportedVersion(v) => (
                        "snapshot_version",
                        format!("unsupported snapshot version {v}"),
                    ),
                    w::RestoreError::Parse(m) => ("snapshot_parse", m),
                    w::RestoreError::Config(m) => ("snapshot_config", m),
                    w::RestoreError::Corrupt(m) => ("snapshot_corrupt", m),
                };
                Error::Restore { code, message }
            })?;
        Ok(inst.with(made))
    }

    /// `Coordinator::restore(snapshot)` inside a fresh instance.
    pub fn restore(&self, snapshot: &Snapshot) -> Result<PluginCoordinator, Error> {
        let json = serde_json::to_string(snapshot).map_err(|e| Error::Restore {
            code: "snapshot_parse",
            message: e.to_string(),
        })?;
        self.restore_json(&json)
    }

    /// Instantiates the component in a new store and drops it: what every coordinator
    /// pays before its constructor runs (for benchmarks).
    #[doc(hidden)]
    pub fn instantiate_only(&self) -> Result<(), Error> {
        self.instantiate().map(drop)
    }

    fn instantiate(&self) -> Result<Instance, Error> {
        let limiter = MemoryCap {
            max_bytes: self.limits.memory_bytes,
            hit: false,
        };
        let mut store = Store::new(self.engine(), HostState { limiter });
        store.limiter(|s| &mut s.limiter);
        let fuel = if self.fuel {
            self.limits.fuel_per_call
        } else {
            None
        };
        if self.fuel {
            // Instantiation runs no guest code of ours, but metering is on: give it room.
            store
                .set_fuel(fuel.unwrap_or(u64::MAX))
                .map_err(|e| Error::Plugin(PluginError::Trap(e.to_string())))?;
        }
        let bindings = self
            .pre
            .instantiate(&mut store)
            .map_err(|e| plugin_failure(&e, &store))?;
        Ok(Instance {
            store,
            bindings,
            fuel,
            metered: self.fuel,
            poisoned: false,
        })
    }
}

/// A store with an instantiated component, before or after its coordinator exists.
struct Instance {
    store: Store<HostState>,
    bindings: bindings::Plugin,
    fuel: Option<u64>,
    metered: bool,
    poisoned: bool,
}

fn plugin_failure(e: &wasmtime::Error, store: &Store<HostState>) -> Error {
    let limits = &store.data().limiter;
    if limits.hit {
        return Error::Plugin(PluginError::MemoryLimit {
            limit_bytes: limits.max_bytes,
        });
    }
    match e.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::OutOfFuel) => Error::Plugin(PluginError::FuelExhausted),
        Some(t) => Error::Plugin(PluginError::Trap(t.to_string())),
        None => Error::Plugin(PluginError::Trap(format!("{e:#}"))),
    }
}

impl Instance {
    /// Runs one guest call with a fresh fuel budget; any failure poisons the instance.
    #[inline]
    fn call<R>(
        &mut self,
        f: impl FnOnce(&bindings::Plugin, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<R, Error> {
        if self.poisoned {
            return Err(Error::Plugin(PluginError::Poisoned));
        }
        if self.metered {
            // Unlimited still has to be refilled: metering cannot be switched off per store.
            let _ = self.store.set_fuel(self.fuel.unwrap_or(u64::MAX));
        }
        match f(&self.bindings, &mut self.store) {
            Ok(r) => Ok(r),
            Err(e) => {
                self.poisoned = true;
                Err(plugin_failure(&e, &self.store))
            }
        }
    }

    fn with(self, handle: ResourceAny) -> PluginCoordinator {
        PluginCoordinator { inst: self, handle }
    }
}

/// A coordinator running inside the plugin: the native
/// [`Coordinator`](tokenwarden_core::Coordinator)'s methods, same names, same core types.
pub struct PluginCoordinator {
    inst: Instance,
    handle: ResourceAny,
}

impl fmt::Debug for PluginCoordinator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginCoordinator")
            .field("poisoned", &self.inst.poisoned)
            .finish_non_exhaustive()
    }
}

macro_rules! guest {
    ($self:ident, |$c:ident, $store:ident, $h:ident| $body:expr) => {{
        let $h = $self.handle;
        $self.inst.call(|b, $store| {
            let $c = b.tokenwarden_quota_coordinator().coordinator();
            $body
        })
    }};
}

impl PluginCoordinator {
    /// The host protocol, [`Coordinator::handle`](tokenwarden_core::Coordinator::handle):
    /// the input crosses as JSON and the output comes back as JSON, so every input the core
    /// takes reaches the plugin without a change to this host or the interface. Drain
    /// [`Self::poll_event`] after it; wake at [`Self::poll_timeout`] with
    /// [`Input::Timeout`].
    pub fn handle(&mut self, now: Millis, input: &Input) -> Result<Output, Error> {
        let text = serde_json::to_string(input).map_err(incompatible)?;
        match guest!(self, |c, s, h| c.call_handle(s, h, now.0, &text))? {
            Ok(out) => serde_json::from_str(&out)
                .map_err(|e| incompatible(format!("the plugin answered an unknown output: {e}"))),
            Err(w::ProtocolError::Lease(e)) => Err(lease_error(e)),
            Err(w::ProtocolError::InvalidInput(why)) => Err(incompatible(format!(
                "the plugin does not take this input: {why}"
            ))),
        }
    }

    /// See [`Coordinator::poll_timeout`](tokenwarden_core::Coordinator::poll_timeout).
    pub fn poll_timeout(&mut self) -> Result<Option<Millis>, Error> {
        Ok(guest!(self, |c, s, h| c.call_poll_timeout(s, h))?.map(Millis))
    }

    /// See [`Coordinator::poll_event`](tokenwarden_core::Coordinator::poll_event).
    pub fn poll_event(&mut self) -> Result<Option<Event>, Error> {
        match guest!(self, |c, s, h| c.call_poll_event(s, h))? {
            None => Ok(None),
            Some(json) => serde_json::from_str(&json)
                .map(Some)
                .map_err(|e| incompatible(format!("the plugin answered an unknown event: {e}"))),
        }
    }

    /// See [`Coordinator::metrics`](tokenwarden_core::Coordinator::metrics).
    pub fn metrics(&mut self, now: Millis) -> Result<Metrics, Error> {
        let json = guest!(self, |c, s, h| c.call_metrics(s, h, now.0))?;
        serde_json::from_str(&json).map_err(incompatible)
    }

    /// See [`Coordinator::snapshot_json`](tokenwarden_core::Coordinator::snapshot_json).
    pub fn snapshot_json(&mut self) -> Result<String, Error> {
        guest!(self, |c, s, h| c.call_snapshot(s, h))
    }

    /// See [`Coordinator::snapshot`](tokenwarden_core::Coordinator::snapshot).
    pub fn snapshot(&mut self) -> Result<Snapshot, Error> {
        let json = self.snapshot_json()?;
        serde_json::from_str(&json).map_err(incompatible)
    }

    /// See [`Coordinator::now`](tokenwarden_core::Coordinator::now).
    pub fn now(&mut self) -> Result<Millis, Error> {
        guest!(self, |c, s, h| c.call_now(s, h)).map(Millis)
    }

    /// See [`Coordinator::pool_id`](tokenwarden_core::Coordinator::pool_id).
    pub fn pool_id(&mut self, name: &str) -> Result<Option<PoolId>, Error> {
        Ok(guest!(self, |c, s, h| c.call_pool_by_name(s, h, name))?.map(PoolId))
    }

    /// The core's internal consistency check, run inside the plugin.
    pub fn check(&mut self) -> Result<(), Error> {
        guest!(self, |c, s, h| c.call_check(s, h))?.map_err(|what| Error::Restore {
            code: "snapshot_corrupt",
            message: what,
        })
    }

    /// Changes the fuel budget of this coordinator's later calls (see
    /// [`Limits::fuel_per_call`]).
    pub fn set_fuel_per_call(&mut self, fuel: Option<u64>) {
        self.inst.fuel = fuel;
    }

    /// Whether an earlier call failed inside the plugin; every call then returns
    /// [`PluginError::Poisoned`].
    #[must_use]
    pub fn is_poisoned(&self) -> bool {
        self.inst.poisoned
    }

    /// Hot reload: moves this coordinator's whole state (leases, queued tickets, debt,
    /// pauses, margins, PRNG, undrained events) into a fresh instance of `plugin`, via
    /// `snapshot` in the old component and `restore` in the new one. On any error the
    /// coordinator keeps running on the old component, unchanged.
    pub fn reload(&mut self, plugin: &Plugin) -> Result<(), Error> {
        let json = self.snapshot_json()?;
        *self = plugin.restore_json(&json)?;
        Ok(())
    }
}

/// The fields `LeaseError::TooLarge` can name (the core hands out `&'static str`).
const TOO_LARGE_FIELDS: [&str; 6] = [
    "input_tokens",
    "cached_prefix_tokens",
    "max_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
    "output_tokens",
];

fn lease_error(e: w::LeaseError) -> Error {
    Error::Lease(match e {
        w::LeaseError::UnknownPool => LeaseError::UnknownPool,
        w::LeaseError::UnknownLease => LeaseError::UnknownLease,
        w::LeaseError::NotGranted => LeaseError::NotGranted,
        w::LeaseError::UnknownTask => LeaseError::UnknownTask,
        w::LeaseError::TooManyTasks => LeaseError::TooManyTasks,
        w::LeaseError::Forbidden => LeaseError::Forbidden,
        w::LeaseError::TooLarge(field) => match TOO_LARGE_FIELDS.iter().find(|f| **f == field) {
            Some(field) => LeaseError::TooLarge { field },
            None => return incompatible(format!("too_large names unknown field `{field}`")),
        },
    })
}
