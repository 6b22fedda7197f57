//! Errors: misuse of the API, never decisions. A decision (grant, queue, reject) is a value.

use core::fmt;

/// A field of the configuration, named the way it is spelled in the JSON shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldPath {
    /// Index into `pools` when the field belongs to a pool.
    pub pool: Option<usize>,
    /// The field's name, e.g. `input_tokens_per_minute` or `margin.floor_permille`.
    pub name: &'static str,
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pool {
            Some(i) => write!(f, "pools[{i}].{}", self.name),
            None => f.write_str(self.name),
        }
    }
}

/// The configuration could not be used.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfigError {
    /// The JSON text is not a configuration (syntax error, unknown field, wrong type).
    Parse(serde_json::Error),
    /// A field holds a value outside its allowed range.
    Invalid {
        /// Which field.
        field: FieldPath,
        /// What is wrong with it, in lowercase words.
        reason: &'static str,
    },
}

impl ConfigError {
    /// A stable, machine-readable code, the same in every binding.
    #[must_use]
    pub const fn code(&self) -> &'static str {
        match self {
            ConfigError::Parse(_) => "config_parse",
            ConfigError::Invalid { .. } => "invalid_config",
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Parse(e) => write!(f, "invalid config json: {e}"),
            ConfigError::Invalid { field, reason } => write!(f, "invalid config: {field} {reason}"),
        }
    }
}

/// A call referred to something that does not exist or passed numbers that make no sense.
/// The coordinator's state is unchanged when one of these is returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseError {
    /// No pool has this index.
    UnknownPool,
    /// No live lease or queued ticket has this id: never issued, forged, or already ended
    /// (settled, cancelled, expired).
    UnknownLease,
    /// The lease is still queued; only a granted lease can be settled.
    NotGranted,
    /// A numeric field is larger than [`MAX_TOKENS`](crate::MAX_TOKENS).
    TooLarge {
        /// The offending field, as spelled in the JSON shape.
        field: &'static str,
    },
    /// No open task has this id: never opened, or already ended.
    UnknownTask,
    /// `max_tasks` tasks are open; end some first.
    TooManyTasks,
    /// A member of a shared limiter acted on a task another agent (or the operator) opened:
    /// a member changes, fails and ends only its own agent's tasks.
    Forbidden,
}

impl LeaseError {
    /// A stable, machine-readable code, the same in every binding.
    #[must_use]
    pub const fn code(&self) -> &'static str {
        match self {
            LeaseError::UnknownPool => "unknown_pool",
            LeaseError::UnknownLease => "unknown_lease",
            LeaseError::NotGranted => "not_granted",
            LeaseError::TooLarge { .. } => "too_large",
            LeaseError::UnknownTask => "unknown_task",
            LeaseError::TooManyTasks => "too_many_tasks",
            LeaseError::Forbidden => "forbidden",
        }
    }
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseError::UnknownPool => f.write_str("unknown pool"),
            LeaseError::UnknownLease => {
                f.write_str("unknown lease: never issued, or already settled, cancelled or expired")
            }
            LeaseError::NotGranted => f.write_str("lease is still queued and cannot be settled"),
            LeaseError::TooLarge { field } => {
                write!(f, "{field} is larger than 2^53 - 1")
            }
            LeaseError::UnknownTask => f.write_str("unknown task: never opened, or already ended"),
            LeaseError::TooManyTasks => {
                f.write_str("too many open tasks: max_tasks are open (three quarters of it for an agent's own open or a request naming a new task; the rest is the operator's): end some before opening more")
            }
            LeaseError::Forbidden => f.write_str(
                "forbidden: this task was opened by another agent or the operator; an agent acts only on the tasks its own calls or opens started",
            ),
        }
    }
}

/// A snapshot could not be restored.
#[derive(Debug)]
#[non_exhaustive]
pub enum RestoreError {
    /// The snapshot was written by an incompatible version of the core.
    UnsupportedVersion(u32),
    /// The JSON text is not a snapshot.
    Parse(serde_json::Error),
    /// The snapshot's configuration fails validation.
    Config(ConfigError),
    /// The snapshot's internal structure is inconsistent (edited or corrupted).
    Corrupt(&'static str),
}

impl RestoreError {
    /// A stable, machine-readable code, the same in every binding.
    #[must_use]
    pub const fn code(&self) -> &'static str {
        match self {
            RestoreError::UnsupportedVersion(_) => "snapshot_version",
            RestoreError::Parse(_) => "snapshot_parse",
            RestoreError::Config(_) => "snapshot_config",
            RestoreError::Corrupt(_) => "snapshot_corrupt",
        }
    }
}

impl fmt::Display for RestoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RestoreError::UnsupportedVersion(v) => write!(f, "unsupported snapshot version {v}"),
            RestoreError::Parse(e) => write!(f, "invalid snapshot json: {e}"),
            RestoreError::Config(e) => write!(f, "snapshot holds an {e}"),
            RestoreError::Corrupt(what) => write!(f, "corrupt snapshot: {what}"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for ConfigError {}
#[cfg(feature = "std")]
impl std::error::Error for LeaseError {}
#[cfg(feature = "std")]
impl std::error::Error for RestoreError {}
